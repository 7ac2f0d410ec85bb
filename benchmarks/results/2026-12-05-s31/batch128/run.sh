cd /work/main
PY=.venv/bin/python
P=benchmarks/results/2026-12-05-s30/seed_spread/probe.py
export PROBE_WORKERS=1
$PY $P run configs/isoflop.toml /work/s30/study/data /work/s30/probe b128 gem:0:1:0.01 dcnv2:0:1:0.01 --set data.batch_size=128
$PY $P run configs/isoflop.toml /work/s30/study/data /work/s30/probe b128 gem:0:1:0.007 dcnv2:0:1:0.007 --set data.batch_size=128
date
