#!/bin/bash
# Session 13: the learning-rate grid [1e-3, 3e-3, 1e-2] completed at every budget for GEM and DCNv2, seed 0
# (session 10 ran it at the smallest budget, and at the largest for the chosen rate's neighbours), two at a time.
cd "$(dirname "$0")"
PY=/work/main/.venv/bin/python
OUT=/work/s12/iso/out
run() { $PY extra_runs.py $OUT "$@" 2>&1 | grep -v -i "warn\|topology\|Heuristical\|else \|shape = \|device = \|md.size" ; }
( run gem 0.001 0 1; run gem 0.01 0 1; run gem 0.001 0 2; run gem 0.01 0 2 ) > grid_gem.log &
( run dcnv2 0.001 0 1; run dcnv2 0.003 0 1; run dcnv2 0.001 0 2; run dcnv2 0.001 0 3 ) > grid_dcnv2.log &
wait
# then: seeds 1-8 of the two rates that seed 0 chose differently from before (GEM 1e-2 at budget 1, DCNv2 1e-3
# at budget 3), so that every frontier point rests on >= 3 seeds (9 where the other rate has 9)
# ( run dcnv2 0.001 1,2,3,4,5,6,7,8 3 ) > seeds_dcnv2.log & ( run gem 0.01 1,2,3,4,5,6,7,8 1 ) > seeds_gem.log &
# then DLRM's grid at the budgets where only its smallest-budget choice (3e-3) ran, seed 0
# ( run dlrm 0.001 0 1; run dlrm 0.001 0 2 ) > grid_dlrm_a.log & ( run dlrm 0.01 0 1; run dlrm 0.01 0 2 ) > grid_dlrm_b.log &
# then seeds 1-2 of DLRM 1e-3 at budgets 1 and 2 (the mean rule's choice there; 3e-3 has 3 seeds)
# ( run dlrm 0.001 1,2 1 ) > seeds_dlrm_a.log & ( run dlrm 0.001 1,2 2 ) > seeds_dlrm_b.log &
