#!/usr/bin/env bash
# The 512-candidate grid cells over HTTP, ranking requests (--context) and rows as candidates, alternating.
#   bash http.sh MODEL_DIR DATA_DIR OUT_DIR ROUNDS
set -euo pipefail
M="$1" DATA="$2" OUT="$3" ROUNDS="${4:-2}"
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  for arm in context rows; do
    extra=()
    [ "$arm" = context ] && extra=(--context user_id,user_interests,hist__item,hist__action)
    uptime > "$OUT/$arm$r.uptime"
    .venv/bin/opengem bench serve --model "$M" --data "$DATA" --backends eager,aoti --candidates 512 \
      --clients 1,16 --requests 2000 --duration 20 --swap-versions 0 --server-threads 1 --body arrow \
      "${extra[@]}" --out "$OUT/$arm$r.json" > "$OUT/$arm$r.txt" 2>/dev/null
    uptime >> "$OUT/$arm$r.uptime"
  done
done
