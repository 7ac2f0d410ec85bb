#!/bin/bash
# The demo's GEM with its cross branch's own 8-wide attribute embeddings (model.gem.cross_width = 8, session 32's
# fifth rung of the study) and with them gated (EPNet, session 33's reverted cross_gate.patch, hidden 16) against
# the recipe (issue 14, session 36). Session 30's protocol (../../2026-12-05-s30/demo_cross/run.sh): configs/
# small.toml's data, train days 0-4, validation day 5 chooses, test day 6 reported only; the demo's schedule and
# lr; seeds 0-4 paired; equal training FLOPs (1220 steps for the recipe at 880,456 FLOPs/example, 1203 at
# 892,744, 1198 at 896,968). Run from a worktree with the patch applied (PYTHONPATH=its src):
#   PYTHONPATH=WT/src bash run.sh DATA OUT        (cwd: WT)
D=$1; O=$2; mkdir -p $O
PY=.venv/bin/python
COMMON="train.lr_decay=cosine train.min_lr_ratio=0.02 train.progress=false train.lr=3e-3"
one() {  # name seed steps overrides...
  local n=$1 s=$2 st=$3; shift 3
  [ -f $O/${n}_seed$s.json ] || $PY benchmarks/quality_harness.py --config configs/small.toml --data $D \
    --out $O/${n}_seed$s.json --train 'day=00[0-4]' --valid day=005 --test day=006 --threads 1 \
    $COMMON train.steps=$st train.seed=$s "$@" > $O/${n}_seed$s.log 2>&1
}
for s in 0 1 2 3 4; do
  one base $s 1220 &
  one width8 $s 1203 model.gem.cross_width=8 &
  wait
  one gate16 $s 1198 model.gem.cross_width=8 model.gem.cross_gate=16
done
