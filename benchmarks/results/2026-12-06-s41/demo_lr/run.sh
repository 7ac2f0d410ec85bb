#!/bin/bash
# Every demo family's learning rate chosen again on the validation day (issue 14, session 41). The demo's rates
# (GEM 3e-3, DLRM 1e-3, DCNv2 3e-3) were chosen in session 5 on another recipe (GEM at d 16 with two InterFormer
# layers, no cross branch, shuffled row groups, no history counts); since then GEM lost a layer and gained a cross
# branch, every family reads the days in order and the history counts. Session 5's protocol and grid, the same
# for every family: lr 1e-3 / 3e-3 / 1e-2, seed 0, the demo's data, train days 0-4 (one pass), validation day 5
# chooses (mean of pooled click and conversion NE), test day 6 reported only; the demo's schedule and each
# family's size and head. DCNv2 at 3e-3 is ../demo_cross_rank/'s dcnv2_seed0, GEM at 3e-3 its run of the rank it
# chose (gem_seed0 or gem_r64_seed0; OUT/gem_rank says which, 16 or 64: at 64 GEM takes 1,125 steps).
#   bash run.sh DATA OUT     # cwd: the repository; DATA: the demo's data (configs/small.toml, counts)
source "$(dirname "$0")/../screen_lib.sh" "$1" "$2"
DCN="model.name=dcnv2 model.head.hidden=[64]"
DLRM="model.name=dlrm model.head.hidden=[64]"
GEM="model.name=gem model.gem.cross_rank=${GEM_RANK:-16}"   # the rank ../demo_cross_rank/ chose (set after it)
one dcnv2_lr1e-2 0 1220 $DCN train.lr=1e-2 &
one dcnv2_lr1e-3 0 1220 $DCN train.lr=1e-3 &
wait
one dlrm_lr1e-3 0 1220 $DLRM train.lr=1e-3 &
one dlrm_lr3e-3 0 1220 $DLRM train.lr=3e-3 &
wait
one dlrm_lr1e-2 0 1220 $DLRM train.lr=1e-2 &
[ -f $O/gem_rank ] && GEM_RANK=$(cat $O/gem_rank)
STEPS=$([ "${GEM_RANK:-16}" = 64 ] && echo 1125 || echo 1220)   # equal FLOPs within GEM, as ../demo_cross_rank/
one gem_lr1e-2 0 $STEPS $GEM train.lr=1e-2
wait
one gem_lr1e-3 0 $STEPS $GEM train.lr=1e-3
