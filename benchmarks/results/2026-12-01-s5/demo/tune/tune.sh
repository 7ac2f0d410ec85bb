#!/bin/bash
# Demo recipe tuning (issue 14), data: small.toml at data.sim.rows=875000 (GEM's compute-optimal size at the
# demo's 2.5e12 budget reads 750k rows). Train days 0-4 (625k rows, 1220 steps), choose on validation day 5,
# cosine decay to 2 % as the demo does. Same lr grid for every family.
cd /work/s5/wt
export OMP_NUM_THREADS=1 PYTHONPATH=/work/s5/wt/src
PY=/work/main/.venv/bin/python
D=/work/s5/sim875/data
COMMON="train.steps=1220 train.lr_decay=cosine train.min_lr_ratio=0.02 train.progress=false"
G="model.embedding.d=16 model.gem.wukong.n_fm=4 model.gem.wukong.n_lin=4 model.gem.wukong.k=4 model.gem.wukong.mlp_dims=[128] model.head.hidden=[32]"
B="model.head.hidden=[64] model.dlrm.bottom_mlp=[128] model.dlrm.top_mlp=[896,448] model.dcnv2.num_cross_layers=2 model.dcnv2.deep_mlp=[480,240]"
LRS=1e-3,3e-3,1e-2
uptime
$PY benchmarks/model_quality.py sim $COMMON $G --data $D --out /work/s5/tune/gem_s0 --models gem --seeds 0 --best-lr-seeds none --lrs $LRS > /work/s5/tune_gem_s0.log 2>&1 &
$PY benchmarks/model_quality.py sim $COMMON $G model.gem.wukong.n_fm=8 model.gem.wukong.n_lin=8 --data $D --out /work/s5/tune/gem_nf8 --models gem --seeds 0 --best-lr-seeds none --lrs $LRS > /work/s5/tune_gem_nf8.log 2>&1 &
wait
uptime
$PY benchmarks/model_quality.py sim $COMMON $B model.embedding.d=32 --data $D --out /work/s5/tune/base_d32 --models dlrm,dcnv2 --seeds 0 --best-lr-seeds none --lrs $LRS > /work/s5/tune_base_d32.log 2>&1 &
$PY benchmarks/model_quality.py sim $COMMON $B model.embedding.d=16 --data $D --out /work/s5/tune/base_d16 --models dlrm,dcnv2 --seeds 0 --best-lr-seeds none --lrs $LRS > /work/s5/tune_base_d16.log 2>&1 &
wait
uptime
echo done
