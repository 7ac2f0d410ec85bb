#!/bin/bash
# Fairness check for ../demo_cross/ (issue 14, session 30): GEM gained a recipe knob chosen on validation, so
# DCNv2 gets one too: a third full-rank cross layer (+11 % FLOPs/example), on the same validation protocol
# (configs/small.toml's data, train days 0-4, validation day 5, test day 6 reported only, the demo's
# schedule, DCNv2's demo rate 3e-3 and head [64]), each for the training FLOPs of the GEM it is compared with
# (../demo_cross/'s cross16: 1,184 steps x 1,263,432 FLOPs/example), as the demo sizes baselines:
# 2 layers 1,873 steps (798,664 FLOPs/example), 3 layers 1,690 (885,192): past one pass over days 0-4 (1,220
# steps), as the demo's DCNv2 reads 1.6 passes; --epochs 2 lets the harness run on, and the table reads the
# last step's validation (the harness also keeps the better epoch's). Seeds 0-4.
#   bash run.sh DATA OUT
COMMON="model.name=dcnv2 model.head.hidden=[64] train.lr_decay=cosine train.min_lr_ratio=0.02 train.progress=false train.lr=3e-3"
HARNESS_EXTRA="--epochs 2"
source "$(dirname "$0")/../demo_cross/run.sh" "$1" "$2"   # one() and D, O, PY
for s in 0 1 2 3 4; do
  one dcn2 $s 1873 &
  one dcn3 $s 1690 model.dcnv2.num_cross_layers=3 &
  wait
done
