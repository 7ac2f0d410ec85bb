#!/bin/bash
# session 45: the default iso-FLOP study from scratch at d98670d, one invocation, detached worktree, the same
# 6.4M-row stream as sessions 40-44 (/work/s40/study/data), nothing else running
cd /work/s45/wt
export PYTHONPATH=/work/s45/wt/src
( while true; do echo "$(date -u +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)" >> /work/s45/study_meta/load.txt; sleep 60; done ) &
LOGGER=$!
date -u +"start %H:%M:%S" > /work/s45/study_meta/times.txt
/usr/bin/time -v /work/main/.venv/bin/python -m opengem.cli scale --design isoflop --budget default --out /work/s45/study --data /work/s40/study/data > /work/s45/study_meta/study.log 2> /work/s45/study_meta/time.txt
echo "exit $?" >> /work/s45/study_meta/times.txt
date -u +"end %H:%M:%S" >> /work/s45/study_meta/times.txt
kill $LOGGER
