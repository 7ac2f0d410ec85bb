#!/bin/bash
# Wukong's cross-layer attention off, its FLOPs spent on rows (issue 14, session 42). Session 31 found the attention
# not paying at the demo (without it +0.0000 / +0.0009 at fewer FLOPs, ../../2026-12-05-s31/demo_ablation/), and
# this session's screens found GEM short of rows at the demo's one pass (../demo_rank_window/, ../demo_window/).
# Off, GEM costs 0.846 MFLOP/example against the recipe's 0.887: 5 % more rows at equal training FLOPs.
# Fixed before running (committed with this file, before any run here):
#   arm: gem_nocla (the recipe at 3dc718b with wukong.cross_layer_attention = false; 1270 steps = 1212 x 0.887 /
#   0.846); compared with ../demo_full_rank/'s runs of the recipe (gem, 1212 steps) on the same seeds 10-14, same
#   code and host (OUT is that screen's folder); the demo's validation protocol;
#   rule: adopted iff the paired 95 % t interval of the validation mean NE minus the recipe's lies below 0.
#   bash run.sh DATA OUT "10 11 12 13 14"    # cwd: the repository
source "$(dirname "$0")/../../2026-12-06-s41/screen_lib.sh" "$1" "$2"
SEEDS=${3:-"10 11 12 13 14"}
GEM="model.name=gem train.lr=3e-3 model.gem.wukong.cross_layer_attention=false"
set -- $SEEDS
while [ $# -gt 0 ]; do
  one gem_nocla $1 1270 $GEM &
  [ $# -gt 1 ] && one gem_nocla $2 1270 $GEM &
  wait; shift; [ $# -gt 0 ] && shift
done
