#!/bin/bash
# session 48: the default ablation study at 38a23e7, on session 47's study stream
cd /work/s48
uptime > load_start.txt
( while true; do echo "$(date -u +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)" >> load.txt; sleep 60; done ) &
LP=$!
PYTHONPATH=/work/s48/wt/src /usr/bin/time -v /work/main/.venv/bin/python -m opengem.cli scale --design ablation \
  --config /work/s48/wt/configs/ablation.toml --out /work/s48/ablation --data /work/s47/study/data \
  > /work/s48/ablation.log 2> /work/s48/ablation.err
echo "rc $?" >> /work/s48/ablation.err
kill $LP
