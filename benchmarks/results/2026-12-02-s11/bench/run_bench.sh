#!/bin/bash
cd /work/main
O=benchmarks/results/2026-12-02-s11/bench
for spec in "fp32 pytorch" "fp32 auto" "bf16 pytorch" "bf16 auto"; do
  set -- $spec
  echo "=== precision $1 cpu_linear $2: $(date -u +%T) $(cat /proc/loadavg)"
  .venv/bin/opengem bench train --config configs/small-d32.toml --models gem,dlrm,dcnv2 --out /work/s11/bench/d32data train.threads=1 train.precision=$1 train.cpu_linear=$2 --json > $O/train_small_d32_$1_$2.json 2>/work/s11/bench/err_$1_$2.log
  .venv/bin/opengem bench train --config configs/small-d32.toml --models gem,dlrm,dcnv2 --out /work/s11/bench/d32data train.threads=1 train.precision=$1 train.cpu_linear=$2 2>&1 | grep -v "^W1202\|Warn\|warn\|Heuristical" > $O/train_small_d32_$1_$2.txt
done
echo "=== end $(date -u +%T) $(cat /proc/loadavg)"
