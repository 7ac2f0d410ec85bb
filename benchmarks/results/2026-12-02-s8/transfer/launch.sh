#!/bin/bash
# The final seeds of configs/transfer-prod.toml, split by VM surface into two processes (tune_per_surface =
# true: every tuning choice is per surface, so the split changes nothing but the wall time). FM versions and
# data were made once (prep_fm.py) and hard-linked into B.
cd /work/main
mkdir -p /work/s8/final/B
for s in 0 1 2 3 4; do [ -d /work/s8/final/B/seed$s ] || cp -al /work/s8/final/A/seed$s /work/s8/final/B/; done
run() {  # out surfaces
  uptime > /work/s8/final/$1.uptime
  OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/opengem transfer --config configs/transfer-prod.toml \
    --out /work/s8/final/$1 "surfaces=$2" > /work/s8/final/$1.log 2>&1
  uptime >> /work/s8/final/$1.uptime
}
run A '["feed","stories"]' &
run B '["video","messaging"]' &
wait
