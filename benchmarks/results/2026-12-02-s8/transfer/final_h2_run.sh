#!/bin/bash
# Final seeds 0-4 of configs/transfer-prod.toml for video and messaging with round 11's vm_history_windows = 2
# (arms only; one process per surface; the streams and FM versions of the session's final run, hard-linked)
cd /work/main
run() {
  uptime > /work/s8/fin2/$1.uptime
  OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/opengem transfer --config configs/transfer-prod.toml \
    --out /work/s8/fin2/$1 "surfaces=[\"$1\"]" vm_history_windows=2 'staleness=[]' > /work/s8/fin2/$1.log 2>&1
  uptime >> /work/s8/fin2/$1.uptime
}
run video &
run messaging &
wait
