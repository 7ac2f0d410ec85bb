#!/bin/bash
# Issue 13: GEM-small (the d32 recipe) before/after, interleaved, one machine state: the code at 6208131
# (the "today", 2026-12-01; its configs/small.toml is today's configs/small-d32.toml) and this
# session's code, fp32, one thread, two rounds, old/new/old/new.
set -u
OUT=/work/s30/ab; mkdir -p $OUT
PY=/work/main/.venv/bin/python
for rep in 1 2; do
  for tree in old new; do
    if [ $tree = old ]; then WT=/work/s30/old; CFG=configs/small.toml; else WT=/work/s30/new; CFG=configs/small-d32.toml; fi
    cd $WT
    uptime > $OUT/load-$tree-$rep.txt
    PYTHONPATH=$WT/src OPENGEM_CPU_LINEAR_CACHE=$OUT/cpu_linear-$tree.json timeout 900 $PY -c "import sys; from opengem.cli import main; sys.exit(main())" \
      bench train --config $CFG --models gem,dlrm,dcnv2 --out /work/s30/ab/data-$tree --json train.threads=1 > $OUT/$tree-$rep.json 2> $OUT/$tree-$rep.err
    uptime >> $OUT/load-$tree-$rep.txt
  done
done
echo done > $OUT/DONE
