#!/bin/bash
# The rank of GEM's cross branch at the demo (issue 14, session 41). With the history counts every family reads,
# DCNv2 leads GEM at the demo, and the missed-signal split puts GEM's deficit in the simulator's three-way attribute
# cross (session 40, ../../2026-12-06-s40/missed_signals/). A two-layer cross network is a cubic polynomial of its
# input; DCNv2's layers are full rank, GEM's cross branch rank 16 (session 30 chose the branch at rank 16 and tried
# no other rank). Arms: rank 16 (the recipe), rank 64, full rank. DCNv2 has no rank to raise (its layers are full
# rank already); its runs are the reference. Session 30's protocol, fixed before running: the demo's data, train
# days 0-4 (one pass), validation day 5 chooses, test day 6 reported only; the demo's schedule, each family's tuned
# rate and head; equal training FLOPs within GEM (a costlier arm takes fewer steps); seeds 0-4 paired, two runs at
# a time. Seeds 0-2 of the recipe and of DCNv2 are session 40's runs (same code on the training path, same host):
#   bash run.sh DATA OUT "0 1 2 3 4"    # cwd: the repository; DATA: the demo's data (configs/small.toml, counts)
source "$(dirname "$0")/../screen_lib.sh" "$1" "$2"
SEEDS=${3:-"0 1 2 3 4"}
GEM="model.name=gem train.lr=3e-3"
DCN="model.name=dcnv2 train.lr=3e-3 model.head.hidden=[64]"
for s in $SEEDS; do
  one gem_full $s 1070 $GEM model.gem.cross_rank=0 &        # 1.003 MFLOP/example: 1220 x 0.881 / 1.003 steps
  one gem_r64 $s 1125 $GEM model.gem.cross_rank=64 &       # 0.954
  wait
  one gem $s 1220 $GEM &                                   # 0.881 (rank 16, the recipe)
  one dcnv2 $s 1220 $DCN &                                 # 0.799
  wait
done
