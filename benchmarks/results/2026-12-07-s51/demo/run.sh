#!/bin/bash
# The demo from a fresh clone at 47ac26f on seeds 0-4, two at a time, one thread per run.
WT=/work/s51/demo_clone; O=/work/s51/demo; cd $WT
log() { echo "$(date -u +%H:%M:%S) $1 load $(cut -d' ' -f1-3 /proc/loadavg)" >> $O/load.log; }
one() { log "start seed $1"; PYTHONPATH=$WT/src /work/main/.venv/bin/python -m opengem.demo --out $O/seed$1 train.progress=false \
          train.seed=$1 train.threads=1 > $O/demo_seed$1.raw 2>&1; log "end seed $1 rc=$?"; }
one 0 & one 1 & wait
one 2 & one 3 & wait
one 4
touch $O/done
