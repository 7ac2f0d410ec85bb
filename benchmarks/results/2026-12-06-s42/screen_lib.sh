#!/bin/bash
# Sourced by this session's screens (each folder's run.sh) with DATA OUT: one quality-harness run per call,
# the demo's validation protocol (configs/small.toml's data, train days 0-4, validation day 5, test day 6, the
# demo's cosine schedule, one thread); a run whose JSON exists is kept (a screen resumes).
#   one NAME SEED STEPS OVERRIDES...     -> OUT/NAME_seedSEED.json and .log
D=$1; O=$2; mkdir -p "$O"
PY=.venv/bin/python
COMMON="train.lr_decay=cosine train.min_lr_ratio=0.02 train.progress=false"
one() {
  local n=$1 s=$2 steps=$3; shift 3
  [ -f $O/${n}_seed$s.json ] || $PY benchmarks/quality_harness.py --config configs/small.toml --data $D \
    --out $O/${n}_seed$s.json --train 'day=00[0-4]' --valid day=005 --test day=006 --threads 1 \
    $COMMON train.steps=$steps train.seed=$s "$@" > $O/${n}_seed$s.log 2>&1
}
