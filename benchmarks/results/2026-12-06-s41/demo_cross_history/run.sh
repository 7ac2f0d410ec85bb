#!/bin/bash
# What of the user's history GEM's cross branch reads (model.gem.cross_sequence; issue 14, session 41). DCNv2's
# cross layers read the tokens and each history's mean event; GEM's cross branch read the tokens only, so it
# could not cross the user's history with the ad's attributes, which DCNv2 does (GEM trails DCNv2 on validation
# click by 0.0049 at every rank, ../demo_cross_rank/). Arms: "mean" (each group's mean event, as DCNv2) and
# "summary" (the InterFormer's summary of the history, GEM's "user" vector), 0.884 MFLOP/example against the
# recipe's 0.881, so 1,215 steps against 1,220 (equal training FLOPs within GEM). Session 30's protocol, fixed
# before running: the demo's data, train days 0-4 (one pass), validation day 5 chooses (mean of pooled click and
# conversion NE), test day 6 reported only; the demo's schedule and GEM's rate 3e-3; seeds paired (0-2 first,
# 3-4 for an arm that leads on validation after them). The recipe and DCNv2 are ../demo_cross_rank/'s runs.
#   bash run.sh DATA OUT "0 1 2"    # cwd: the repository
source "$(dirname "$0")/../screen_lib.sh" "$1" "$2"
SEEDS=${3:-"0 1 2"}
GEM="model.name=gem train.lr=3e-3"
for s in $SEEDS; do
  one gem_xmean $s 1215 $GEM model.gem.cross_sequence=mean &
  one gem_xsum $s 1215 $GEM model.gem.cross_sequence=summary &
  wait
done
