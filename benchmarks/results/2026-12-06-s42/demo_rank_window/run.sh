#!/bin/bash
# Moving FLOPs from GEM's sequence window to its cross branch's rank, at the demo (issue 14, session 42).
# Session 41 (../../2026-12-06-s41/demo_cross_rank/): rank 64 gained on conversion (test -0.0040, resolved) but not
# resolved on the validation mean (-0.0016 [-0.0034, +0.0001]), and it costs 8 % more FLOPs per example, so the
# one-pass demo could not adopt it at equal compute. Here the rank's FLOPs come from the pyramid encoder's local
# attention window (16 -> 8 events; 0.813 MFLOP/example with rank 16): window 8 + rank 64 is 0.887 MFLOP/example
# against the recipe's 0.881 (+0.7 %), so it can replace the recipe at the demo's one pass.
# Fixed before running (session 42, committed before the first run):
#   arms: gem (recipe: rank 16, window 16, 1220 steps), gem_r64w8 (rank 64, window 8, 1212 steps = equal
#   training FLOPs), gem_r64 (rank 64, window 16, 1125 steps: session 41's arm again on fresh seeds, for
#   information; not adoptable at the one-pass demo);
#   seeds 5-9 (fresh: session 41 used 0-4), every arm run here on the same code, two at a time;
#   data: the demo's (configs/small.toml, this host), train days 0-4 (one pass), validation day 5, test day 6;
#   rule: gem_r64w8 replaces the recipe iff its paired 95 % t interval of the validation mean NE
#   ((all/click + all/conversion) / 2) minus the recipe's lies below 0; the test day is reported, never used.
#   bash run.sh DATA OUT "5 6 7 8 9"    # cwd: the repository; DATA: the demo's data
source "$(dirname "$0")/../../2026-12-06-s41/screen_lib.sh" "$1" "$2"
SEEDS=${3:-"5 6 7 8 9"}
GEM="model.name=gem train.lr=3e-3"
for s in $SEEDS; do
  one gem $s 1220 $GEM &                                                            # 0.881 MFLOP/example
  one gem_r64w8 $s 1212 $GEM model.gem.cross_rank=64 model.gem.sequence.window=8 &  # 0.887
  wait
  one gem_r64 $s 1125 $GEM model.gem.cross_rank=64                                  # 0.954
done
