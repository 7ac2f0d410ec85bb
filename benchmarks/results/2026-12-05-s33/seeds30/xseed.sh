#!/bin/bash
# usage: xseed.sh INIT DATA  -> trains gem s0 b1 with init seed INIT and data order of seed DATA (train.seed = INIT)
cd /work/main
out=/work/s33/xseed/i$1_d$2
mkdir -p $out
OG_INIT_SEED=$1 OG_DATA_SEED=$2 .venv/bin/python -m opengem.bench.isoflop_worker configs/isoflop.toml $out /work/s30/study/data gem 0 1 0.01 $1 > $out/log.txt 2>&1
echo "$1 $2 exit $?"
