#!/bin/bash
# GEM's cross branch at full rank, as DCNv2's layers are, paid for by Wukong's cross-layer attention (issue 14,
# session 42). After ../demo_rank_window/ (rank 16 -> 64 paid by the sequence window 16 -> 8: validation -0.0022,
# adopted) GEM still trails DCNv2 on the demo's click by 0.0021 (../demo/). Session 41's full-rank arm lost
# (+0.0025) while reading 12 % fewer rows at equal FLOPs; session 31 found the cross-layer attention not paying
# (without it +0.0000 / +0.0009, ../../2026-12-05-s31/demo_ablation/). Full rank without the cross-layer attention
# at window 8 is 0.895 MFLOP/example against the recipe's 0.887, so it reads 1 % fewer rows.
# Fixed before running (committed with this file, before any run here):
#   arms: gem (the recipe as of 3dc718b: rank 64, window 8, cross-layer attention on; 1212 steps) and gem_full_nocla
#   (cross_rank 0 = full, cross_layer_attention off, window 8; 1200 steps = the same training FLOPs, 1212 x 0.887 /
#   0.895); fresh seeds 10-14; the demo's data, train days 0-4 (one pass), validation day 5, test day 6 reported
#   only; rule: gem_full_nocla replaces the recipe iff its paired 95 % t interval of the validation mean NE
#   ((all/click + all/conversion) / 2) minus the recipe's lies below 0.
#   bash run.sh DATA OUT "10 11 12 13 14"    # cwd: the repository
source "$(dirname "$0")/../../2026-12-06-s41/screen_lib.sh" "$1" "$2"
SEEDS=${3:-"10 11 12 13 14"}
GEM="model.name=gem train.lr=3e-3"
for s in $SEEDS; do
  one gem $s 1212 $GEM &                                                                             # 0.887
  one gem_full_nocla $s 1200 $GEM model.gem.cross_rank=0 model.gem.wukong.cross_layer_attention=false &  # 0.895
  wait
done
