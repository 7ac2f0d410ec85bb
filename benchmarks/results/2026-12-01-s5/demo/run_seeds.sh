#!/bin/bash
cd /work/s5/wt2
export OMP_NUM_THREADS=1 PYTHONPATH=/work/s5/wt2/src
uptime > /work/s5/demo/uptime_start.txt
for s in 0 1 2 3 4; do
  /work/main/.venv/bin/python -m opengem.demo --out /work/s5/demo/seed$s train.progress=false train.seed=$s > /work/s5/demo/demo_seed$s.txt 2>&1 &
done
wait
uptime > /work/s5/demo/uptime_end.txt
