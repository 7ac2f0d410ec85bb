#!/bin/bash
# session 49: the screen fixed in benchmarks/results/2026-12-07-s49/screen/PLAN.md (11 candidates x 2 seeds at 5e10)
cd /work/main
( while true; do echo "$(date -u +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)" >> /work/s49/screen_load.txt; sleep 60; done ) &
LP=$!
/usr/bin/time -v .venv/bin/python -m opengem.cli scale --design ablation --config /work/s49/screen/screen.toml \
  --out /work/s49/screen --data /work/s47/study/data > /work/s49/screen.log 2> /work/s49/screen.err
echo "rc $?" >> /work/s49/screen.err
kill $LP
