#!/bin/bash
# frappe_x1: is DCNv2's x30 its dense or its sparse rate, and would GEM and Wukong take the same sparse rate?
# lr_compare.py's grid scales both together; here they move apart (seed 0, the harness and split as lr_compare).
#   bash split_rates.sh DATA OUT      (DATA: lr_compare's converted frappe_x1 folder)
D=$1; O=$2; mkdir -p $O
PY=.venv/bin/python
one() {  # name model lr sparse_lr
  [ -f $O/$1.json ] || $PY benchmarks/quality_harness.py --config configs/frappe.toml --data $D --out $O/$1.json \
    --train train --valid valid --test test --epochs 0 model.name=$2 train.seed=0 train.lr=$3 \
    train.sparse_lr=$4 > $O/$1.log 2>&1
}
one gem_d3e-3_s0.5 gem 0.003 0.5 & one gem_d3e-3_s1.5 gem 0.003 1.5 & wait
one wukong_d3e-3_s0.5 wukong 0.003 0.5 & one wukong_d3e-3_s1.5 wukong 0.003 1.5 & wait
one dcnv2_d3e-3_s1.5 dcnv2 0.003 1.5 & one dcnv2_d0.03_s0.15 dcnv2 0.03 0.15 & wait
