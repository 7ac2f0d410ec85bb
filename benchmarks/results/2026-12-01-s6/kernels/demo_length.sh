#!/bin/bash
# issue 13: GEM at the demo's full length with the reference kernels, more seeds, to set beside the demo's
# five fused seeds (benchmarks/results/2026-12-01-s5/demo/demo_seed{0..4}.txt) and session 5's two
# reference seeds (benchmarks/results/2026-12-01-s5/kernels/). Same run as the demo's GEM: its saved
# config.toml (configs/small.toml + lr 3e-3, cosine decay to 2 % over 1,464 steps of days 0-5), the demo's
# data (the same 875k-row simulation, also at /work/s5/sim875/data), evaluated on day 6 by the Trainer's
# final evaluation (the demo's evaluate_run reads the same checkpoint on the same rows).
# Usage: demo_length.sh OUT_DIR KERNEL SEEDS     e.g. demo_length.sh /work/s6/h13k/demo pytorch "2 3 4"
set -e
out=$1; kernel=$2; seeds=$3
repo=$(cd "$(dirname "$0")/../../../.." && pwd)
mkdir -p "$out"
for s in $seeds; do
  echo "$(date -u +%H:%M:%S) $kernel seed $s: $(uptime)" >> "$out/uptime.txt"
  "$repo/.venv/bin/python" -m opengem.cli train --config /work/s5/demo/seed0/gem/config.toml \
    --data /work/s5/sim875/data --out "$out/${kernel}_seed$s" --force train.seed=$s \
    model.gem.kernel="'$kernel'" train.final_eval=true train.threads=1 train.progress=false \
    > "$out/${kernel}_seed$s.log" 2>&1
done
echo "$(date -u +%H:%M:%S) done: $(uptime)" >> "$out/uptime.txt"
