#!/bin/bash
# Issue 13's bench on this host (AVX-512 with bf16 dot products, no AMX), run after the study, nothing else running.
cd /work/s50/code
while [ ! -f /work/s50/study.done ]; do sleep 20; done
mkdir -p /work/s50/bench
for p in fp32 bf16; do
  echo "$(date -u +%H:%M:%S) start $p load $(cut -d' ' -f1-3 /proc/loadavg)" >> /work/s50/bench/load.log
  PYTHONPATH=/work/s50/code/src /work/main/.venv/bin/python -m opengem.cli bench train --config configs/small-d32.toml \
    --models gem,dcnv2,dlrm --out /work/s50/bench/data train.precision=$p > /work/s50/bench/bench_$p.txt 2> /work/s50/bench/bench_$p.err
  echo "$(date -u +%H:%M:%S) end $p rc=$? load $(cut -d' ' -f1-3 /proc/loadavg)" >> /work/s50/bench/load.log
done
touch /work/s50/bench/done
