# A/B of the study's cells: old code (a worktree of 6c4ab8f at /work/s45/old) and new (d98670d at /work/s45/wt)
# side by side, one per core, then with the cores swapped; the only change a training run sees is the reused
# footer (src/opengem/data/parquet.py). Usage: abcell.sh OUT BUDGET FAMILY...
OUT=$1; B=$2; shift 2
cd /work/main
run() { # code core family budget tag
  PYTHONPATH=$([ $1 = old ] && echo /work/s45/old/src || echo /work/s45/wt/src) taskset -c $2 \
    .venv/bin/python -m opengem.bench.isoflop_worker /work/s44/isoflop.toml $OUT/$1-$5 /work/s40/study/data $3 0 $4 0.003 0 > /dev/null 2>&1
}
for fam in "$@"; do
  run old 0 $fam $B a & run new 1 $fam $B a; wait
  run new 0 $fam $B b & run old 1 $fam $B b; wait
  for tag in a b; do for code in old new; do
    f=$(ls -d $OUT/$code-$tag/runs/$fam-s0-b$B-*)
    echo "$fam b$B $code $tag $(python3 -c "import hashlib,json;d=json.load(open('$f/train_summary.json'));r=json.load(open('$f/result.json'));print(round(d['train_seconds'],2), 'metrics', hashlib.sha256(json.dumps([r['valid'],r['test']],sort_keys=True).encode()).hexdigest()[:12])") load $(cut -d' ' -f1 /proc/loadavg)"
  done; done
done
