#!/bin/bash
# Scoring cost of finished study runs, the code before (OLD worktree: four passes a run) and after (NEW: two),
# both at once, one per core, then the cores swapped: the same runs, the same host minute.
#   bash scoring_ab.sh OLD_WORKTREE NEW_WORKTREE OUT_DIR RUN...
OLD=$1; NEW=$2; OUT=$3; shift 3
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/work/main/.venv/bin/python
mkdir -p "$OUT"
for round in 1 2; do
  if [ $round = 1 ]; then a=0; b=1; else a=1; b=0; fi
  PYTHONPATH=$OLD/src taskset -c $a $PY "$HERE/scoring_ab.py" "$OUT/old.jsonl" "$@" > "$OUT/old-$round.txt" 2>/dev/null &
  PYTHONPATH=$NEW/src taskset -c $b $PY "$HERE/scoring_ab.py" "$OUT/new.jsonl" "$@" > "$OUT/new-$round.txt" 2>/dev/null &
  wait
done
