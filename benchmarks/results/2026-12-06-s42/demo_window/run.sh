#!/bin/bash
# Which half of ../demo_rank_window/'s adopted arm pays: the sequence window 8 alone, at the old rank 16 (issue 14,
# session 42). Fixed before running (committed with this file, after ../demo_rank_window/ adopted rank 64 +
# window 8 into configs/small.toml and before any run here):
#   arm: gem_w8 (rank 16, window 8: 0.813 MFLOP/example, 1321 steps = the recipe's training FLOPs, 1220 x 0.881 /
#   0.813); compared with ../demo_rank_window/'s runs of the same seeds 5-9 on the same code and host: gem (rank
#   16, window 16) and gem_r64w8 (rank 64, window 8, now the recipe); the same protocol (train days 0-4, one
#   pass, validation day 5, test day 6 reported only);
#   rule: gem_w8 replaces the recipe iff its paired 95 % t interval of the validation mean NE minus gem_r64w8's
#   lies below 0; either way the table says how much of the adopted gain each half carries.
#   bash run.sh DATA OUT "5 6 7 8 9"    # cwd: the repository; OUT: ../demo_rank_window/'s OUT (reuses its runs)
source "$(dirname "$0")/../../2026-12-06-s41/screen_lib.sh" "$1" "$2"
SEEDS=${3:-"5 6 7 8 9"}
GEM="model.name=gem train.lr=3e-3 model.gem.cross_rank=16 model.gem.sequence.window=8"
set -- $SEEDS
while [ $# -gt 0 ]; do
  one gem_w8 $1 1321 $GEM &
  [ $# -gt 1 ] && one gem_w8 $2 1321 $GEM &
  wait; shift; [ $# -gt 0 ] && shift
done
