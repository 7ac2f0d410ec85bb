#!/bin/bash
# GEM with the rank-16 cross branch + cross_width 8 on real data: 5 seeds, GEM's chosen rate (as session 31's arms)
OUT="$(realpath -m "${1:?usage: run.sh OUT}")"
cd "$(dirname "$0")/../../../.."
P=.venv/bin/python
O="model.gem.cross_layers=2 model.gem.cross_rank=16 model.gem.cross_width=8"
nice -n 5 $P benchmarks/lr_compare.py --datasets kuairand_pure --models gem --seeds 0,1,2,3,4 --scales 1 --jobs 1 --out "$OUT" $O
nice -n 5 $P benchmarks/lr_compare.py --datasets frappe_x1 --models gem --seeds 0,1,2,3,4 --scales 3 --jobs 1 --out "$OUT" $O
echo done
