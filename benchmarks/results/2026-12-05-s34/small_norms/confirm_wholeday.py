"""The confirmation's paired table on the whole test day (session 34).

    W=benchmarks/results/2026-12-05-s32/cross_width/wholeday.py
    ls -d OUT/*/runs/*-seed* | xargs -P2 -n1 python $W > WHOLEDAY
    python confirm_wholeday.py WHOLEDAY

WHOLEDAY: a line per run, "RUN_DIR<TAB>NE ..." (the study's two-task NE, Platt refit on the validation day).
"""
import statistics as st
import sys
from pathlib import Path

from opengem.bench.fit import mean_ci

ARMS = {("nonorm", "gem"): "GEM without norms", ("base", "gem"): "GEM recipe", ("base", "dcnv2"): "DCNv2 s0"}

ne: dict[str, dict[int, float]] = {name: {} for name in ARMS.values()}
for line in Path(sys.argv[1]).read_text().splitlines():
    run, value = line.split("\t")[:2]
    p = Path(run)
    arm = ARMS[(p.parents[1].name, p.name.split("-")[0])]
    ne[arm][int(p.name.rsplit("-seed", 1)[1])] = float(value)

print("| whole test day | seeds | mean (sd) | median |")
print("|---|---|---|---|")
for arm, v in ne.items():
    x = list(v.values())
    print(f"| {arm} | {len(x)} | {st.mean(x):.4f} ({st.stdev(x):.4f}) | {st.median(x):.4f} |")
print()
print("| paired by seed | difference [95 % t] | GEM lower on |")
print("|---|---|---|")
PAIRS = (("GEM without norms", "DCNv2 s0"), ("GEM without norms", "GEM recipe"), ("GEM recipe", "DCNv2 s0"))
for a, b in PAIRS:
    seeds = sorted(set(ne[a]) & set(ne[b]))
    d = [ne[a][s] - ne[b][s] for s in seeds]
    m, h = mean_ci(d)
    lower = sum(x < 0 for x in d)
    print(f"| {a} - {b} | {m:+.4f} [{m - h:+.4f}, {m + h:+.4f}] | {lower} of {len(d)} |")
