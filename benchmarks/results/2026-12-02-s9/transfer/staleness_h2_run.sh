#!/bin/bash
# Session 9: configs/transfer-prod.toml as committed (surface_history_windows: video and messaging 2) on its
# final seeds 0-4, video and messaging, arms and the staleness sweep 0/1/2/4/8; one process per surface; the
# streams and FM versions of session 8's final run, hard-linked into /work/s9/stale/<surface>/seedN
cd /work/main
run() {
  uptime > /work/s9/stale/$1.uptime
  OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/opengem transfer --config configs/transfer-prod.toml \
    --out /work/s9/stale/$1 "surfaces=[\"$1\"]" > /work/s9/stale/$1.log 2>&1
  uptime >> /work/s9/stale/$1.uptime
}
run video &
run messaging &
wait
