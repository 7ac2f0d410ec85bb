#!/bin/bash
# Every demo family's head width chosen on the validation day (issue 14, session 41): GEM's [32] was never
# screened at the demo (session 5 chose its Wukong size), the baselines' [64] was tuned in session 5 on another
# recipe. The same grid for every family, [32] / [64] / [128], seed 0, the demo's validation protocol (train days
# 0-4, one pass, validation day 5 chooses on the mean of pooled click and conversion NE, test day 6 reported
# only) at each family's rate (../demo_lr/). Equal training FLOPs within GEM (a wider head takes fewer steps);
# the baselines read the training days once, as the demo trains them (their heads keep them under GEM's FLOPs).
# The recipe's widths are ../demo_cross_rank/'s gem_seed0 and dcnv2_seed0 and ../demo_lr/'s dlrm runs.
#   bash run.sh DATA OUT     # cwd: the repository
source "$(dirname "$0")/../screen_lib.sh" "$1" "$2"
GEM="model.name=gem train.lr=${GEM_LR:-3e-3}"
DCN="model.name=dcnv2 train.lr=${DCN_LR:-3e-3}"
DLRM="model.name=dlrm train.lr=${DLRM_LR:-1e-3}"
[ "$3" = "--define-only" ] && return 0   # sourced by confirm.sh for one() and the families' settings
one gem_h64 0 1184 $GEM model.head.hidden=[64] &        # 0.907 MFLOP/example: 1220 x 0.881 / 0.907
one gem_h128 0 1118 $GEM model.head.hidden=[128] &      # 0.961
wait
one dcnv2_h32 0 1220 $DCN model.head.hidden=[32] &
one dcnv2_h128 0 1220 $DCN model.head.hidden=[128] &
wait
one dlrm_h32 0 1220 $DLRM model.head.hidden=[32] &
one dlrm_h128 0 1220 $DLRM model.head.hidden=[128] &
wait
