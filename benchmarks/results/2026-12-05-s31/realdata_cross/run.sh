#!/bin/bash
# GEM with / without the rank-16 cross branch on real data, 5 seeds, GEM's chosen rate (scale 1 KuaiRand, 3 frappe NE-rule)
cd /work/main
P=.venv/bin/python
for arm in none cross; do
  if [ $arm = cross ]; then O="model.gem.cross_layers=2 model.gem.cross_rank=16"; else O=""; fi
  nice -n 5 $P benchmarks/lr_compare.py --datasets kuairand_pure --models gem --seeds 0,1,2,3,4 --scales 1 --jobs 1 --out /work/s31/real_$arm $O
done
for arm in none cross; do
  if [ $arm = cross ]; then O="model.gem.cross_layers=2 model.gem.cross_rank=16"; else O=""; fi
  nice -n 5 $P benchmarks/lr_compare.py --datasets frappe_x1 --models gem --seeds 0,1,2,3,4 --scales 3 --jobs 1 --out /work/s31/real_$arm $O
done
echo done
