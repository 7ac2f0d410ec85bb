#!/bin/bash
# Session 51: issue 13's bench and issue 16's serving grid on this host (Intel Xeon, AVX-512 without bf16, no AMX).
cd /work/s51/code
M=/work/s51/meas
log() { echo "$(date -u +%H:%M:%S) $1 load $(cut -d' ' -f1-3 /proc/loadavg)" >> $M/load.log; }
for p in fp32 bf16; do
  log "start bench $p"
  PYTHONPATH=src .venv/bin/python -m opengem.cli bench train --config configs/small-d32.toml \
    --models gem,dcnv2,dlrm --out /work/s51/benchdata train.precision=$p > $M/bench_$p.txt 2> $M/bench_$p.err
  log "end bench $p rc=$?"
done
log "start bench bf16 thin"
PYTHONPATH=src .venv/bin/python -m opengem.cli bench train --config configs/small-d32.toml \
  --models gem --out /work/s51/benchdata train.precision=bf16 train.cpu_bf16_thin=bf16 > $M/bench_bf16_thin.txt 2> $M/bench_bf16_thin.err
log "end bench bf16 thin rc=$?"
log "start serve_vm"
bash benchmarks/serve_vm.sh --out /work/s51/serve > $M/serve_vm.log 2>&1
log "end serve_vm rc=$?"
touch $M/done
