#!/bin/bash
# issue 13: GEM's NE under train.precision=bf16 vs fp32 (the demo's seeds 0-2 are the fp32 side), same data and eval.
cd /work/s5/wt2
export OMP_NUM_THREADS=1 PYTHONPATH=/work/s5/wt2/src
uptime > /work/s5/bf16/uptime_start.txt
for s in 0 1 2; do
  /work/main/.venv/bin/python -m opengem.demo --out /work/s5/bf16/seed$s --set 'baselines=[]' train.progress=false train.seed=$s train.precision=bf16 > /work/s5/bf16/bf16_seed$s.txt 2>&1 &
done
wait
uptime > /work/s5/bf16/uptime_end.txt
