#!/bin/bash
# issue 13, cheap reproduction: GEM of configs/small.toml, 300 steps (153,600 rows) of days 0-4 of the demo's
# data, final NE on all of day 5 (the validation day), one thread, fused vs reference kernels, paired seeds.
# Usage: repro.sh OUT_DIR SEEDS [extra overrides...]   e.g. repro.sh /work/s6/h13k/before "0 1 2"
# Writes OUT_DIR/{fused,pytorch}_seedS/ (run folders) and OUT_DIR/uptime.txt; table: summarize.py OUT_DIR.
set -e
out=$1; seeds=$2; shift 2
repo=$(cd "$(dirname "$0")/../../../.." && pwd)
mkdir -p "$out"
for s in $seeds; do
  for k in fused pytorch; do
    echo "$(date -u +%H:%M:%S) $k seed $s: $(uptime)" >> "$out/uptime.txt"
    "$repo/.venv/bin/python" -m opengem.cli train --config "$repo/configs/small.toml" \
      --data /work/s5/sim875/data --out "$out/${k}_seed$s" --force \
      "data.train='day=00[0-4]'" "data.eval='day=005'" train.steps=300 train.threads=1 \
      train.progress=false train.eval_every=0 train.seed=$s model.gem.kernel=$k "$@" \
      > "$out/${k}_seed$s.log" 2>&1
  done
done
echo "$(date -u +%H:%M:%S) done: $(uptime)" >> "$out/uptime.txt"
