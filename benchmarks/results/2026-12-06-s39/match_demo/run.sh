#!/bin/bash
# History-vs-ad counts (schema match_features: hist.category vs ad_category and hist.item vs ad_id, the latest 8
# events) given to every family, against the demo's recipe (session 39, a screen for issue 14).
# Session 30's protocol: configs/small.toml's data, train days 0-4 (one pass, 1,220 steps), validation day 5,
# test day 6 reported only; the demo's schedule, each family's tuned rate and head; seeds paired. The recipe's runs
# are session 37's daily arm (`../../2026-12-05-s37/demo_chrono/runs/*_daily_*`, the recipe's data order); seed 0
# of GEM is rerun here to check that today's code reproduces them.
#   bash run.sh DATA MATCHED OUT SEEDS    # MATCHED: DATA's partitions with a schema.toml declaring the counts
D=$1; M=$2; O=$3; SEEDS=${4:-"0 1 2"}; mkdir -p $O
PY=.venv/bin/python
COMMON="train.lr_decay=cosine train.min_lr_ratio=0.02 train.progress=false train.steps=1220"
one() {  # name data seed overrides...
  local n=$1 d=$2 s=$3; shift 3
  [ -f $O/${n}_seed$s.json ] || $PY benchmarks/quality_harness.py --config configs/small.toml --data $d \
    --out $O/${n}_seed$s.json --train 'day=00[0-4]' --valid day=005 --test day=006 --threads 1 \
    $COMMON train.seed=$s "$@" > $O/${n}_seed$s.log 2>&1
}
GEM="model.name=gem train.lr=3e-3"
DCN="model.name=dcnv2 train.lr=3e-3 model.head.hidden=[64]"
DLRM="model.name=dlrm train.lr=1e-3 model.head.hidden=[64]"
one gem_recheck $D 0 $GEM &
for s in $SEEDS; do
  one gem_match $M $s $GEM
  wait
  one dcnv2_match $M $s $DCN &
  one dlrm_match $M $s $DLRM
  wait
done
