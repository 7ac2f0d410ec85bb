#!/bin/bash
# Issue 13 before/after bench, interleaved, one machine state. Usage: run13.sh OUTDIR
set -u
OUT=${1:-/tmp/bench_train_r13}; mkdir -p $OUT
cd "$(git rev-parse --show-toplevel)"
PY=$PWD/.venv/bin/python
for rep in 1 2; do
 for prec in fp32 bf16; do
  if [ $rep = 2 ] && [ $prec = bf16 ]; then continue; fi
  for tree in base new; do
   if [ $tree = base ]; then SRC=${BASE_SRC:?set BASE_SRC to the src/ of a worktree at the base commit}; else SRC=$PWD/src; fi
   uptime > $OUT/load-$tree-$prec-$rep.txt
   PYTHONPATH=$SRC timeout 900 $PY -c "import sys; from opengem.cli import main; sys.exit(main())" bench train --config configs/small.toml \
     --models gem,dlrm,dcnv2 --out /tmp/bench13data --json train.precision=$prec > $OUT/$tree-$prec-$rep.json 2> $OUT/$tree-$prec-$rep.err
   uptime >> $OUT/load-$tree-$prec-$rep.txt
  done
 done
done
echo done > $OUT/DONE
