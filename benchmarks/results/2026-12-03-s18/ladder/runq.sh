#!/bin/bash
# Train the cells of a queue file (lines: FAMILY SIZE BUDGET RATE SEEDS), PARALLEL at a time, into $OUT/runs on the
# stream in $OUT/data (cell.py simulates it when DATA is ""; see ../README.md), logs beside them.
#   [TOML=ladder_recent_5e11.toml] OUT=/work/s18/lad ./runq.sh QUEUE_FILE PARALLEL
Q=$(realpath "$1"); OUT=$(realpath "${OUT:-/work/s18/lad}"); cd "$(dirname "$(realpath "$0")")/../../../.." || exit 1
L=benchmarks/results/2026-12-03-s18/ladder/${TOML:-ladder_recent.toml}
xargs -P "$2" -L 1 bash -c '.venv/bin/python benchmarks/results/2026-12-02-s15/ladder/cell.py '"$L $OUT $OUT"'/data \
  $0 $1 $2 $3 $4 train.cpu_linear=onednn >> '"$OUT"'/log_$0_$1_$2_$4.txt 2>&1' < "$Q"
