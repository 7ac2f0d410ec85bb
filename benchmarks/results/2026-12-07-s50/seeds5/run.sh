#!/bin/bash
cd /work/s50
(while true; do echo "$(date -u +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 60; done) > load5.log &
LP=$!
start=$(date +%s)
/work/main/.venv/bin/python -m opengem.cli scale --design isoflop --budget default --out /work/s50/study5 --data /work/s50/study/data --set seeds=5 > study5.out 2> study5.err
echo "rc=$? wall_s=$(( $(date +%s) - start ))" > study5.done
kill $LP
