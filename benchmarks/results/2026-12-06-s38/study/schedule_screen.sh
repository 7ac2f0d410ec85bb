#!/usr/bin/env bash
# Each order's chosen cells at 1.58e11 (budget 3), seed 0, under one schedule override (e.g.
# train.min_lr_ratio=0.2), through the study's own code (python -m opengem.bench.isoflop_worker), two at a time.
#   bash schedule_screen.sh TIME_ORDER_STUDY_TOML SHUFFLED_STUDY_TOML DATA OUT OVERRIDE
set -euo pipefail
ordered=$1 shuffled=$2 data=$3 out=$4 override=$5
mkdir -p "$out"
{
  echo "$ordered $out/ordered gem 0 0.01 data.shuffle_window=-1"
  echo "$shuffled $out/shuffled gem 4 0.01 data.shuffle_window=8"
  echo "$ordered $out/ordered dcnv2 0 0.003 data.shuffle_window=-1"
  echo "$shuffled $out/shuffled dcnv2 1 0.003 data.shuffle_window=8"
  echo "$ordered $out/ordered dlrm 1 0.003 data.shuffle_window=-1"
  echo "$shuffled $out/shuffled dlrm 1 0.003 data.shuffle_window=8"
} | xargs -P 2 -L 1 sh -c 'python -m opengem.bench.isoflop_worker "$0" "$1" '"$data"' "$2" "$3" 3 "$4" 0 \
      '"$override"' "$5" 2>&1 | grep "^isoflop: [a-z0-9]*-" | sed "s|^|$1 |"'
