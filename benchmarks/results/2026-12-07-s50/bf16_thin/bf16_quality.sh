#!/bin/bash
# Issue 13: GEM-small (configs/small-d32.toml, its own 200k simulated rows) seeds 0-2 in three arms, final eval on day 6.
cd /work/main
O=/work/s50/bf16
mkdir -p $O/runs
echo "$(date -u +%H:%M:%S) quality start load $(cut -d' ' -f1-3 /proc/loadavg)" >> $O/load.log
.venv/bin/opengem train --config configs/small-d32.toml --out $O/runs/fp32-seed0 train.seed=0 train.precision=fp32 > $O/runs/fp32-seed0.log 2>&1
D=$O/runs/fp32-seed0/data
for s in 0 1 2; do
  [ $s = 0 ] || echo "fp32 $s train.precision=fp32"
  echo "bf16-thin-fp32 $s train.precision=bf16 train.cpu_bf16_thin=fp32"
  echo "bf16-thin-bf16 $s train.precision=bf16 train.cpu_bf16_thin=bf16"
done | xargs -P 2 -L 1 bash -c '.venv/bin/opengem train --config configs/small-d32.toml --data '$D' --out '$O'/runs/$0-seed$1 train.seed=$1 "${@:2}" > '$O'/runs/$0-seed$1.log 2>&1'
echo "$(date -u +%H:%M:%S) quality done load $(cut -d' ' -f1-3 /proc/loadavg)" >> $O/load.log
touch $O/quality_done
