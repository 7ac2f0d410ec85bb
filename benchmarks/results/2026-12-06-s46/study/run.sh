#!/bin/bash
# session 46: the default iso-FLOP study from scratch at ecca5d1 (eval_sample = spread, eval_rows = 65536), one
# invocation, detached worktree, the same 6.4M-row stream as sessions 40-45 (/work/s40/study/data)
cd /work/s46/wt
export PYTHONPATH=/work/s46/wt/src
( while true; do echo "$(date -u +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)" >> /work/s46/study_meta/load.txt; sleep 60; done ) &
LOGGER=$!
date -u +"start %H:%M:%S" > /work/s46/study_meta/times.txt
/usr/bin/time -v /work/main/.venv/bin/python -m opengem.cli scale --design isoflop --budget default --out /work/s46/study --data /work/s40/study/data > /work/s46/study_meta/study.log 2> /work/s46/study_meta/time.txt
echo "exit $?" >> /work/s46/study_meta/times.txt
date -u +"end %H:%M:%S" >> /work/s46/study_meta/times.txt
kill $LOGGER
