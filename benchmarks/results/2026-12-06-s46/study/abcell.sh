# A/B of one training cell of the default study: the code before this session (a worktree of 7921064 at
# /work/s46/old) and this session's (ecca5d1 at /work/s46/wt) side by side, one per core, then with the cores
# swapped. The only change a training run sees is an `if` in ParquetLoader.all_units (spread_rows is 0 in
# training). Usage: abcell.sh OUT BUDGET FAMILY...
OUT=$1; B=$2; shift 2
cd /work/main
run() { # code core family budget tag
  PYTHONPATH=$([ $1 = old ] && echo /work/s46/old/src || echo /work/s46/wt/src) taskset -c $2 \
    .venv/bin/python -m opengem.bench.isoflop_worker /work/s44/isoflop.toml $OUT/$1-$5 /work/s40/study/data $3 0 $4 0.003 0 > /dev/null 2>&1
}
for fam in "$@"; do
  run old 0 $fam $B a & run new 1 $fam $B a; wait
  run new 0 $fam $B b & run old 1 $fam $B b; wait
  for tag in a b; do for code in old new; do
    f=$(ls -d $OUT/$code-$tag/runs/$fam-s0-b$B-*)
    echo "$fam b$B $code $tag $(python3 -c "import json;d=json.load(open('$f/train_summary.json'));print(round(d['train_seconds'],2))") load $(cut -d' ' -f1 /proc/loadavg)"
  done; done
done
