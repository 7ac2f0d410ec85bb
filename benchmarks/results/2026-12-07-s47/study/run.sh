#!/bin/bash
# session 47: the default iso-FLOP study from scratch (stream simulated in the same invocation) at 62fabdc
# (one pass over each scored day per run), one invocation, detached worktree
cd /work/s47/wt
export PYTHONPATH=/work/s47/wt/src
( while true; do echo "$(date -u +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)" >> /work/s47/meta/load.txt; sleep 60; done ) &
LOGGER=$!
date -u +"start %H:%M:%S" > /work/s47/meta/times.txt
/usr/bin/time -v /work/main/.venv/bin/python -m opengem.cli scale --design isoflop --budget default --out /work/s47/study > /work/s47/meta/study.log 2> /work/s47/meta/time.txt
echo "exit $?" >> /work/s47/meta/times.txt
date -u +"end %H:%M:%S" >> /work/s47/meta/times.txt
kill $LOGGER
