#!/bin/bash
# The demo's GEM with and without a DCNv2 cross branch (issue 14, session 30): configs/small.toml's data
# (875k rows simulated), train days 0-4 (625k rows), validation day 5 (chooses), test day 6 (reported only);
# the demo's schedule (cosine to 2 %), its lr 3e-3, seeds 0-4, at equal training FLOPs (the cross branch's
# 3 % more FLOPs/example paid for with 3 % fewer steps: 1184 instead of 1220).
#   bash run.sh DATA OUT
# ../demo_dcn3/run.sh sources this file for one() (with its own COMMON and HARNESS_EXTRA) and runs its own loop.
D=$1; O=$2; mkdir -p $O
PY=.venv/bin/python
COMMON=${COMMON:-"train.lr_decay=cosine train.min_lr_ratio=0.02 train.progress=false train.lr=3e-3"}
one() {  # name seed steps overrides...
  local n=$1 s=$2 st=$3; shift 3
  [ -f $O/${n}_seed$s.json ] || $PY benchmarks/quality_harness.py --config configs/small.toml --data $D \
    --out $O/${n}_seed$s.json --train 'day=00[0-4]' --valid day=005 --test day=006 --threads 1 \
    $HARNESS_EXTRA $COMMON train.steps=$st train.seed=$s "$@" > $O/${n}_seed$s.log 2>&1
}
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0
for s in 0 1 2 3 4; do
  one base $s 1220 &
  one cross16 $s 1184 model.gem.cross_layers=2 model.gem.cross_rank=16 &
  wait
done
