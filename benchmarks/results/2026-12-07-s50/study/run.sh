#!/bin/bash
# The default study from scratch (stream generated too), from a snapshot clone at HEAD.
cd /work/s50
(while true; do echo "$(date -u +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 60; done) > load.log &
LP=$!
start=$(date +%s)
PYTHONPATH=/work/s50/code/src /work/main/.venv/bin/python -m opengem.cli scale --design isoflop --budget default --out /work/s50/study > study.out 2> study.err
echo "rc=$? wall_s=$(( $(date +%s) - start ))" > study.done
kill $LP
