#!/bin/bash
# session 49: the width knob at full rows (issue 14 item 3's "narrower" proxy) at the current size: d 4 -> 2
# (d_multiple 2), every configuration, 3 seeds, full rows; session 48's full runs (copied) reused
cd /work/s49
( while true; do echo "$(date -u +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)" >> narrow_load.txt; sleep 60; done ) &
LP=$!
/usr/bin/time -v /work/main/.venv/bin/python -m opengem.cli scale --design ablation \
  --config /work/s49/ablation_rescore/ablation.toml --out /work/s49/narrow --data /work/s47/study/data \
  --set 'proxies=[{name = "narrow2", d_divisor = 2, d_multiple = 2, seeds = 3}]' \
  > /work/s49/narrow.log 2> /work/s49/narrow.err
echo "rc $?" >> /work/s49/narrow.err
kill $LP
