#!/bin/bash
# Does GEM's sequence path still pay at the demo now that every family reads the history counts (issue 14,
# session 41)? Half of the demo GEM's FLOPs (0.46 of 0.88 MFLOP/example) are the pyramid encoder and the InterFormer;
# session 40's missed-signal split finds every family, GEM included, missing at most 0.002 NE of the simulator's
# history terms once the counts are read. Scout at seed 0 (the demo's validation protocol: train days 0-4, one
# pass, validation day 5 chooses, test day 6 reported only; the demo's schedule and rate): GEM without sequences
# (model.gem.use_sequences = false: the Wukong stack with cross-layer attention, the cross branch, the counts),
# two Wukong layers (0.42 MFLOP/example) and four (0.78), each reading the training days once (fewer FLOPs than
# the recipe: a second pass over the same rows overfits, session 30). The recipe is ../demo_cross_rank/gem_seed0.
#   bash run.sh DATA OUT "0"    # cwd: the repository
source "$(dirname "$0")/../screen_lib.sh" "$1" "$2"
SEEDS=${3:-"0"}
GEM="model.name=gem train.lr=${LR:-3e-3} model.gem.use_sequences=false"
for s in $SEEDS; do
  one gem_noseq_l2 $s 1220 $GEM &
  one gem_noseq_l4 $s 1220 $GEM model.gem.wukong.num_layers=4 &
  wait
done
