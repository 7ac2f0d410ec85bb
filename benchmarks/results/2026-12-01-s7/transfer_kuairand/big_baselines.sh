#!/bin/bash
# bigger baseline VMs (arms=["baseline"]) on run5's FM versions, for the NE-vs-serving-FLOPs Pareto plot
cd /work/s7/wt_kr
run() {  # out d top head bottom
  OMP_NUM_THREADS=1 PYTHONPATH=/work/s7/wt_kr/src nice -n 5 /usr/bin/time -v /work/main/.venv/bin/python -m opengem.cli transfer \
    --config configs/transfer-kuairand.toml --out /work/s7/kr/$1 'data.path="/work/s7/kr/data"' 'seeds=[0,1,2,3,4]' \
    validation_windows=1 tune_per_surface=true 'arms=["baseline"]' 'staleness=[]' vm_first_window=5 vm.model.embedding.d=$2 \
    "vm.model.dlrm.top_mlp=$3" "vm.model.head.hidden=$4" "vm.model.dlrm.bottom_mlp=$5" > /work/s7/kr/$1.log 2>&1
  uptime >> /work/s7/kr/$1.log
}
uptime > /work/s7/kr/big.uptime
run big25k 16 '[64,32]' '[32]' '[32]'
run big48k 16 '[128,64]' '[64]' '[32]'
run big77k 16 '[192,96]' '[64]' '[32]'
