#!/bin/bash
# Bigger baseline VMs (arms = ["baseline"], labels only, epochs tuned on the same validation windows) on the
# final run's data and FM versions (hard links), for the NE-vs-serving-FLOPs plot: 1.8x, 3.5x and 9.4x the
# VM's 14,320 FLOPs/example (parameter sharing runs at 9.7x). vm.flops_budget = 0: these VMs are over the
# serving budget on purpose. An optional second argument LR trains them at train.lr = LR (and
# train.sparse_lr = LR) instead of the VM's 3e-2 / 0.03: each size's rate is then chosen per surface on the
# validation windows (pareto.py), so the bigger VMs are not held to the small VM's rate.
cd /work/main
LR=${2:-}
EXTRA=()
SUFFIX=""
if [ -n "$LR" ]; then EXTRA=(train.lr=$LR train.sparse_lr=$LR); SUFFIX="_lr$LR"; fi
run() {  # name d top head bottom
  set -- "$1$SUFFIX" "${@:2}"
  mkdir -p /work/s8/final/$1
  for s in 0 1 2 3 4; do [ -d /work/s8/final/$1/seed$s ] || { mkdir -p /work/s8/final/$1/seed$s;
    cp -al /work/s8/final/A/seed$s/data /work/s8/final/A/seed$s/fm /work/s8/final/$1/seed$s/; }; done
  uptime > /work/s8/final/$1.uptime
  OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/opengem transfer --config configs/transfer-prod.toml \
    --out /work/s8/final/$1 'arms=["baseline"]' 'staleness=[]' vm.flops_budget=0 vm.model.embedding.d=$2 \
    "vm.model.dlrm.top_mlp=$3" "vm.model.head.hidden=$4" "vm.model.dlrm.bottom_mlp=$5" "${EXTRA[@]}" > /work/s8/final/$1.log 2>&1
  uptime >> /work/s8/final/$1.uptime
}
case "$1" in
  25k) run big25k 16 '[64,32]' '[32]' '[32]' ;;
  51k) run big51k 16 '[128,64]' '[64]' '[32]' ;;
  135k) run big135k 32 '[256,128]' '[64]' '[64]' ;;
esac
