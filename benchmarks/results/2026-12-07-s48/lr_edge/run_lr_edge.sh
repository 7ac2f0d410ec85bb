#!/bin/bash
# session 48: is the ablation's rate (1e-2, the grid's top) bracketed? The full model at 3e-2, seed 0, same
# study and validation rows (the 1e-2 run copied from ../ablation/runs/ and reused)
cd /work/s48
PYTHONPATH=/work/s48/wt/src /work/main/.venv/bin/python -m opengem.cli scale --design ablation \
  --config /work/s48/wt/configs/ablation.toml --out /work/s48/lr_edge --data /work/s47/study/data \
  --set 'ablations=[{name = "d8", component = "embedding width 4 -> 8", overrides = ["model.embedding.d=8"]}]' --set 'proxies=[]' --set seeds=2 --set 'lr_grid=[0.01,0.03]' \
  > /work/s48/lr_edge.log 2> /work/s48/lr_edge.err
echo "rc $?" >> /work/s48/lr_edge.err
