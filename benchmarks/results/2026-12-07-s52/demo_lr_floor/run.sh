#!/bin/bash
# The learning-rate floor at the demo, GEM and DCNv2 (issue 14, session 52).
# Every screen so far kept the demo's schedule, cosine from the peak to 0.02 x the peak at the last step. The
# demo reads its days in order and two of the simulator's click terms drift from day to day (docs/SCALING.md,
# "How much of the oracle gap is reachable"): a model whose rate has decayed to 2 % on the last training day
# barely follows that day's drift, and the validation and test days come right after it. Does a higher floor
# (0.2) or no decay at all (a constant rate after the warm-up) pay, and does it pay GEM more than DCNv2?
# Fixed before running (session 52, committed before the first run):
#   arms per family: the recipe (cosine to 0.02), floor 0.2 (cosine to 0.2), none (constant after warm-up);
#   GEM at the recipe (lr 3e-3, rank 64, window 8: 1212 steps), DCNv2 at the recipe (lr 3e-3, head [128]: 1220
#   steps, one pass); DLRM (far behind both on every seed) not screened;
#   data: the demo's (configs/small.toml, this host), train days 0-4 (one pass), validation day 5, test day 6;
#   stage 1: seeds 0-2 for every arm; stage 2: seeds 3-4 for each arm whose stage-1 mean of the validation
#   mean NE ((all/click + all/conversion) / 2) is below its family's recipe;
#   rule: an arm replaces its family's schedule iff, over seeds 0-4 paired, its 95 % t interval of the validation
#   mean NE minus the recipe's lies below 0 (of two such arms, the lower mean); the test day is reported only.
#   bash run.sh DATA OUT "0 1 2" [arms]   # cwd: the repository; DATA: the demo's data
source "$(dirname "$0")/../../2026-12-06-s41/screen_lib.sh" "$1" "$2"
SEEDS=${3:-"0 1 2"}
ARMS=${4:-"gem gem_floor02 gem_const dcnv2 dcnv2_floor02 dcnv2_const"}
GEM="model.name=gem train.lr=3e-3"
DCN="model.name=dcnv2 train.lr=3e-3 model.head.hidden=[128]"
arm() {  # NAME SEED
  case $1 in
    gem) one gem $2 1212 $GEM ;;
    gem_floor02) one gem_floor02 $2 1212 $GEM train.min_lr_ratio=0.2 ;;
    gem_const) one gem_const $2 1212 $GEM train.lr_decay=none ;;
    dcnv2) one dcnv2 $2 1220 $DCN ;;
    dcnv2_floor02) one dcnv2_floor02 $2 1220 $DCN train.min_lr_ratio=0.2 ;;
    dcnv2_const) one dcnv2_const $2 1220 $DCN train.lr_decay=none ;;
  esac
}
jobs=()
for s in $SEEDS; do for a in $ARMS; do jobs+=("$a $s"); done; done
for ((i = 0; i < ${#jobs[@]}; i += 2)); do   # two at a time
  arm ${jobs[i]} &
  [ $((i + 1)) -lt ${#jobs[@]} ] && arm ${jobs[i + 1]} &
  wait
done
