"""This study's runs against session 44's: NE equality run by run, training core-minutes by budget and family,
and the ratio of each run's training seconds to session 44's (median and range by family).

    python compare.py THIS/isoflop_runs.csv ../../2026-12-06-s44/study/isoflop_runs.csv
"""

import collections
import csv
import statistics
import sys

this = {r["name"]: r for r in csv.DictReader(open(sys.argv[1]))}
then = {r["name"]: r for r in csv.DictReader(open(sys.argv[2]))}
ne_cols = [c for c in next(iter(this.values())) if c.startswith(("valid_ne", "test_ne", "test_cal"))]
same = [n for n in this if n in then and all(this[n][c] == then[n][c] for c in ne_cols)]
print(f"runs: {len(this)} here, {len(then)} in session 44, {len(set(this) & set(then))} in both; "
      f"{len(same)} with every NE and calibration column equal")

by_budget, by_family = collections.Counter(), collections.Counter()
for r in this.values():
    by_budget[r["flops_budget"]] += float(r["train_seconds"]) / 60
    by_family[r["family"]] += float(r["train_seconds"]) / 60
print("training core-minutes by budget: " + ", ".join(f"{float(b):.3g}: {m:.1f}" for b, m in sorted(
    by_budget.items(), key=lambda kv: float(kv[0]))) + f"; total {sum(by_budget.values()):.1f}")
print("by family: " + ", ".join(f"{f} {m:.1f}" for f, m in by_family.most_common()))

ratios = collections.defaultdict(list)
for n in set(this) & set(then):
    ratios[this[n]["family"]].append(float(this[n]["train_seconds"]) / float(then[n]["train_seconds"]))
print("training seconds, this run / session 44's, per run:")
for f, xs in sorted(ratios.items()):
    print(f"  {f:7s} n {len(xs):3d} median {statistics.median(xs):.3f} range {min(xs):.3f}-{max(xs):.3f}")
allx = [x for xs in ratios.values() for x in xs]
print(f"  all     n {len(allx):3d} median {statistics.median(allx):.3f}")
