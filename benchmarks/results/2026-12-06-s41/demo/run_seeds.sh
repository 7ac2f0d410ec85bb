#!/bin/bash
# The demo (as committed at 4c93cbf: DCNv2's head [128]) on seeds 0-4, two at a time, one thread per run, from a
# git worktree of that commit:
#   bash run_seeds.sh WORKTREE OUT
WT=$1; O=$2; mkdir -p $O
cd $WT
one() { PYTHONPATH=$WT/src /work/main/.venv/bin/python -m opengem.demo --out $O/seed$1 train.progress=false \
          train.seed=$1 train.threads=1 > $O/demo_seed$1.raw 2>&1; }
one 0 & one 1 & wait
one 2 & one 3 & wait
one 4
