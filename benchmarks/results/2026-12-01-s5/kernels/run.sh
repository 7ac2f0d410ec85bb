#!/bin/bash
# issue 13: GEM on the demo recipe with the reference (pytorch) kernels vs the default fused ones, seeds 0-1.
cd /work/s5/wt2
export OMP_NUM_THREADS=1 PYTHONPATH=/work/s5/wt2/src
uptime > /work/s5/ref/uptime_start.txt
for s in 0 1; do
  /work/main/.venv/bin/python -m opengem.demo --out /work/s5/ref/seed$s --set 'baselines=[]' train.progress=false train.seed=$s model.gem.kernel=pytorch > /work/s5/ref/ref_seed$s.txt 2>&1 &
done
wait
uptime > /work/s5/ref/uptime_end.txt
