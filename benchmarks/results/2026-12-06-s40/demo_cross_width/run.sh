#!/bin/bash
# The cross branch's own 8-wide embeddings of the small-vocabulary features (model.gem.cross_width = 8; the study's
# GEM rung s4, chosen at its two largest budgets) at the demo, with the history counts every family reads (session
# 40; the missed-signal split of the demo's seed 0 says GEM misses more of the simulator's three-way attribute
# cross than DCNv2 does). DCNv2 gets the same knob (model.dcnv2.cross_width = 8). Session 30's protocol: the demo's
# data, train days 0-4 (one pass), validation day 5 chooses, test day 6 reported only; the demo's schedule, each
# family's tuned rate and head; equal training FLOPs per family (a wider arm takes fewer steps); seeds paired, one
# run at a time beside the iso-FLOP study.
#   bash run.sh DATA OUT "0 1 2"    # cwd: the repository; DATA: the demo's data (configs/small.toml, counts)
D=$1; O=$2; SEEDS=${3:-"0 1 2"}; mkdir -p $O
PY=.venv/bin/python
COMMON="train.lr_decay=cosine train.min_lr_ratio=0.02 train.progress=false"
one() {  # name seed steps overrides...
  local n=$1 s=$2 steps=$3; shift 3
  [ -f $O/${n}_seed$s.json ] || $PY benchmarks/quality_harness.py --config configs/small.toml --data $D \
    --out $O/${n}_seed$s.json --train 'day=00[0-4]' --valid day=005 --test day=006 --threads 1 \
    $COMMON train.steps=$steps train.seed=$s "$@" > $O/${n}_seed$s.log 2>&1
}
GEM="model.name=gem train.lr=3e-3"
DCN="model.name=dcnv2 train.lr=3e-3 model.head.hidden=[64]"
for s in $SEEDS; do
  one gem $s 1220 $GEM                                     # 0.881 MFLOP/example
  one gem_cw8 $s 1203 $GEM model.gem.cross_width=8         # 0.893: 1220 x 0.881 / 0.893 steps
  one dcnv2 $s 1220 $DCN                                   # 0.799
  one dcnv2_cw8 $s 1048 $DCN model.dcnv2.cross_width=8     # 0.930 (its cross layers are full rank)
done
