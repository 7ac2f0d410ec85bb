#!/bin/bash
# Session 9: the bigger baseline VMs of the NE-vs-serving-FLOPs plot for video and messaging under the
# committed regime (surface_history_windows: 2 windows of history there), as session 8's big_baselines.sh
# did at 0: labels only, epochs tuned on the validation windows, sizes 1.8x / 3.5x / 9.4x the VM's 14,320
# FLOPs/example, each at train.lr = sparse_lr = 3e-2, 1e-2 and 3e-3 (pareto.py keeps, per surface and size,
# the rate with the lowest validation NE). Nine runs, two at a time; data and FM versions of the final run.
# usage: big_baselines_h2.sh             (all nine)
cd /work/main
one() {  # size lr
  case "$1" in
    25k) set -- "$@" 16 '[64,32]' '[32]' '[32]' ;;
    51k) set -- "$@" 16 '[128,64]' '[64]' '[32]' ;;
    135k) set -- "$@" 32 '[256,128]' '[64]' '[64]' ;;
  esac
  local name=big$1_lr$2 out=/work/s9/big/big$1_lr$2
  for s in 0 1 2 3 4; do [ -d $out/seed$s ] || { mkdir -p $out/seed$s;
    cp -al /work/s8/final/A/seed$s/data /work/s8/final/A/seed$s/fm $out/seed$s/; }; done
  uptime > /work/s9/big/$name.uptime
  OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/opengem transfer --config configs/transfer-prod.toml \
    --out $out 'surfaces=["video", "messaging"]' 'arms=["baseline"]' 'staleness=[]' vm.flops_budget=0 \
    vm.model.embedding.d=$3 "vm.model.dlrm.top_mlp=$4" "vm.model.head.hidden=$5" "vm.model.dlrm.bottom_mlp=$6" \
    train.lr=$2 train.sparse_lr=$2 > /work/s9/big/$name.log 2>&1
  uptime >> /work/s9/big/$name.uptime
}
export -f one
mkdir -p /work/s9/big
printf '%s\n' "135k 0.03" "135k 0.01" "135k 0.003" "51k 0.03" "51k 0.01" "51k 0.003" "25k 0.03" "25k 0.01" \
  "25k 0.003" | xargs -P 2 -L 1 bash -c 'one $0 $1'
