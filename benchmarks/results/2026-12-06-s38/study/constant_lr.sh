#!/usr/bin/env bash
# The two data orders' chosen cells at 1.58e11 (budget 3), seeds 0-2, with a constant dense rate
# (train.lr_decay=none) instead of the study's cosine to 2 %: through the study's own code
# (python -m opengem.bench.isoflop_worker: the study's rows, names and evaluation), two runs at a time.
#   bash constant_lr.sh TIME_ORDER_STUDY_TOML SHUFFLED_STUDY_TOML DATA OUT
set -euo pipefail
ordered=$1 shuffled=$2 data=$3 out=$4
mkdir -p "$out"
{
  for s in 0 1 2; do
    echo "$ordered $out/ordered gem 0 0.01 $s data.shuffle_window=-1"
    echo "$ordered $out/ordered dcnv2 0 0.003 $s data.shuffle_window=-1"
    echo "$ordered $out/ordered dlrm 1 0.003 $s data.shuffle_window=-1"
    echo "$shuffled $out/shuffled gem 4 0.01 $s data.shuffle_window=8"
    echo "$shuffled $out/shuffled dcnv2 1 0.003 $s data.shuffle_window=8"
    echo "$shuffled $out/shuffled dlrm 1 0.003 $s data.shuffle_window=8"
  done
} | xargs -P 2 -L 1 sh -c 'python -m opengem.bench.isoflop_worker "$0" "$1" '"$data"' "$2" "$3" 3 "$4" "$5" \
      train.lr_decay=none "$6" 2>&1 | grep "^isoflop:"'
