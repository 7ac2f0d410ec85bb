#!/bin/bash
# session 44: the default iso-FLOP study from scratch at c3c8845, one invocation, detached worktree
cd /work/s44/wt
export PYTHONPATH=/work/s44/wt/src
( while true; do echo "$(date -u +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)" >> /work/s44/study_meta/load.txt; sleep 60; done ) &
LOGGER=$!
date -u +"start %H:%M:%S" > /work/s44/study_meta/times.txt
/usr/bin/time -v /work/main/.venv/bin/python -m opengem.cli scale --design isoflop --budget default --out /work/s44/study --data /work/s40/study/data > /work/s44/study_meta/study.log 2> /work/s44/study_meta/time.txt
echo "exit $?" >> /work/s44/study_meta/times.txt
date -u +"end %H:%M:%S" >> /work/s44/study_meta/times.txt
kill $LOGGER
