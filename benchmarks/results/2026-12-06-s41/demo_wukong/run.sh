#!/bin/bash
# Wukong's interaction width at the demo (issue 14 ablation "Wukong k and nF/nL", session 41): session 5 chose
# nF = nL = 8 over 4 on another recipe, and k (the FM's compressed rank) and the FM's MLP were never screened
# at the demo. Arms at equal training FLOPs within GEM: k = 8 (0.906 MFLOP/example, 1,185 steps) and MLP [256]
# (0.934, 1,150), against the recipe's k = 4, MLP [128] (0.881, 1,220). Scout at seed 0, the demo's validation
# protocol (train days 0-4, one pass, validation day 5 chooses on the mean of pooled click and conversion NE,
# test day 6 reported only); an arm that leads the recipe at seed 0 runs seeds 1-2 and is adopted only when the
# paired validation mean resolves (the rule of ../demo_cross_rank/ and ../demo_head/confirm.sh). The recipe is
# ../demo_cross_rank/'s runs.
#   bash run.sh DATA OUT "0"    # cwd: the repository
source "$(dirname "$0")/../screen_lib.sh" "$1" "$2"
SEEDS=${3:-"0"}
GEM="model.name=gem train.lr=3e-3"
for s in $SEEDS; do
  one gem_k8 $s 1185 $GEM model.gem.wukong.k=8 &
  one gem_mlp256 $s 1150 $GEM model.gem.wukong.mlp_dims=[256] &
  wait
done
