#!/bin/bash
# Train the cells of a queue file (lines: FAMILY SIZE BUDGET RATE SEEDS; '#' lines skipped), PARALLEL at a time,
# into $OUT/runs on the stream in $DATA (session 18's 2.8M-row stream; cell.py simulates it when DATA is ""),
# logs beside them.
#   DATA=/work/s18/lad/data OUT=/work/s19/lad ./runq.sh QUEUE_FILE PARALLEL
Q=$(realpath "$1"); OUT=$(realpath -m "${OUT:-/work/s19/lad}"); mkdir -p "$OUT"
cd "$(dirname "$(realpath "$0")")/../../../.." || exit 1
L=benchmarks/results/2026-12-03-s19/ladder/${TOML:-ladder_s19.toml}
grep -v '^#' "$Q" | xargs -P "$2" -L 1 bash -c '.venv/bin/python benchmarks/results/2026-12-02-s15/ladder/cell.py '"$L $OUT $DATA"' \
  $0 $1 $2 $3 $4 train.cpu_linear=onednn >> '"$OUT"'/log_$0_$1_$2_$3_$4.txt 2>&1'
