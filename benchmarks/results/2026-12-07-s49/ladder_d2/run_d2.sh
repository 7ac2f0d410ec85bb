#!/bin/bash
# session 49: the default study's ladders for GEM, DCNv2 and DLRM extended below d 4 (each chosen rung with d halved),
# on session 47's study folder (every existing run reused)
cd /work/main
( while true; do echo "$(date -u +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)" >> /work/s49/d2_load.txt; sleep 60; done ) &
LP=$!
date -u +"start %H:%M:%S" > /work/s49/d2_times.txt
/usr/bin/time -v .venv/bin/python -m opengem.cli scale --design isoflop --config /work/s49/study_d2/isoflop_d2.toml \
  --out /work/s49/study_d2 --data /work/s47/study/data --families gem,dcnv2,dlrm > /work/s49/d2.log 2> /work/s49/d2.err
echo "exit $?" >> /work/s49/d2_times.txt
date -u +"end %H:%M:%S" >> /work/s49/d2_times.txt
kill $LP
