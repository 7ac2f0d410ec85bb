#!/bin/bash
cd /work/main
run() {
  uptime > /work/s8/r11/$1.uptime
  OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/opengem transfer --config configs/transfer-prod-small.toml \
    --out /work/s8/r11/$1 "surfaces=[\"$1\"]" vm_history_windows=2 > /work/s8/r11/$1.log 2>&1
  uptime >> /work/s8/r11/$1.uptime
}
run video &
run messaging &
wait
