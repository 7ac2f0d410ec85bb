#!/bin/bash
# session 48: does a milder row cut rank like the full runs? The same study with the proxy rows x 0.5 (3 seeds);
# the full runs copied from ../ablation/runs/ and reused, so only the 39 proxy runs train
cd /work/s48
( while true; do echo "$(date -u +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)" >> proxy2_load.txt; sleep 60; done ) &
LP=$!
PYTHONPATH=/work/s48/wt/src /usr/bin/time -v /work/main/.venv/bin/python -m opengem.cli scale --design ablation \
  --config /work/s48/wt/configs/ablation.toml --out /work/s48/proxy2 --data /work/s47/study/data \
  --set 'proxies=[{name = "rows2", rows_fraction = 0.5, seeds = 3}]' \
  > /work/s48/proxy2.log 2> /work/s48/proxy2.err
echo "rc $?" >> /work/s48/proxy2.err
kill $LP
