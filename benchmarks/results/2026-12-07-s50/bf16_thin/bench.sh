#!/bin/bash
# Issue 13: train.cpu_bf16_thin on this host, the bench (after the five-seed study, nothing else running):
# GEM-small fp32, bf16 with the thin products in fp32 (the default), bf16 with them left to autocast.
cd /work/main
O=/work/s50/bf16
mkdir -p $O
while [ ! -f /work/s50/study5.done ]; do sleep 15; done
for arm in "fp32 train.precision=fp32" "bf16-thin-fp32 train.precision=bf16 train.cpu_bf16_thin=fp32" "bf16-thin-bf16 train.precision=bf16 train.cpu_bf16_thin=bf16"; do
  set -- $arm; name=$1; shift
  echo "$(date -u +%H:%M:%S) bench $name load $(cut -d' ' -f1-3 /proc/loadavg)" >> $O/load.log
  .venv/bin/opengem bench train --config configs/small-d32.toml --models gem --out /work/s50/bench/data "$@" > $O/bench_$name.txt 2> $O/bench_$name.err
done
echo "$(date -u +%H:%M:%S) bench done load $(cut -d' ' -f1-3 /proc/loadavg)" >> $O/load.log
touch $O/bench_done
