# A/B of the study's cells: old code (HEAD worktree) and new code side by side, one per core, then swapped.
# usage: abcell.sh OUT BUDGET FAMILY...  (old = a worktree of 63b56b5 at /work/s44/old, new = c3c8845's tree)
# session 44: bash abcell.sh /work/s44/abc 2 dcnv2 gem wukong dlrm din, stopped during dlrm to start the study
OUT=$1; B=$2; shift 2
cd /work/main
run() { # code core family budget tag
  PYTHONPATH=$([ $1 = old ] && echo /work/s44/old/src || echo /work/main/src) taskset -c $2 \
    .venv/bin/python -m opengem.bench.isoflop_worker /work/s44/isoflop.toml $OUT/$1-$5 /work/s40/study/data $3 0 $4 0.003 0 > /dev/null 2>&1
}
for fam in "$@"; do
  run old 0 $fam $B a & run new 1 $fam $B a; wait
  run new 0 $fam $B b & run old 1 $fam $B b; wait
  for tag in a b; do for code in old new; do
    f=$(ls -d $OUT/$code-$tag/runs/$fam-s0-b$B-*)
    echo "$fam b$B $code $tag $(python3 -c "import json;d=json.load(open('$f/train_summary.json'));r=json.load(open('$f/result.json'));print(round(d['train_seconds'],2), r['valid'].get('ne', r['valid']) if isinstance(r['valid'],dict) else r['valid'])" | cut -c1-60) load $(cut -d' ' -f1 /proc/loadavg)"
  done; done
done
