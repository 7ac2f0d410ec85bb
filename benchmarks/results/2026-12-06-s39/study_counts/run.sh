#!/usr/bin/env bash
# The default study's chosen cells at its largest budget (1.58e11, budget 3; session 34: GEM s4 lr 0.01, DCNv2 s1
# lr 0.003, DLRM s1 lr 0.003), seeds 0-2, on the study's stream with the history counts declared (a schema.toml
# with match_features over the same partitions), through the study's own code, two runs at a time. Sizes and
# rates are the no-counts study's choices, not re-chosen: a first look, not the study.
#   bash run.sh MATCHED_DATA OUT        (cwd: the repository)
set -euo pipefail
data=$1 out=$2
mkdir -p "$out"
{
  for s in 0 1 2; do
    echo "gem 4 0.01 $s"
    echo "dcnv2 1 0.003 $s"
    echo "dlrm 1 0.003 $s"
  done
} | xargs -P 2 -L 1 sh -c 'python -m opengem.bench.isoflop_worker configs/isoflop.toml '"$out $data"' "$0" "$1" 3 \
      "$2" "$3" 2>&1 | grep "^isoflop:"'
