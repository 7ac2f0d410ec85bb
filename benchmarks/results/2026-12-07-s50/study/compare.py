"""This study's runs against session 49's same-named runs (its isoflop_runs.csv): which validation NE
reproduce bit for bit, how far GEM's moved, and the training time per family.
Usage: python compare.py NEW.csv OLD.csv"""
import collections
import csv
import statistics
import sys

new = {r["name"]: r for r in csv.DictReader(open(sys.argv[1]))}
old = {r["name"]: r for r in csv.DictReader(open(sys.argv[2]))}
count: collections.Counter = collections.Counter()
moved = collections.defaultdict(list)
secs = collections.defaultdict(lambda: [0.0, 0.0])
for name, r in new.items():
    fam = r["family"]
    if name not in old:
        count[fam, "only here"] += 1
        continue
    d = float(r["valid_ne"]) - float(old[name]["valid_ne"])
    count[fam, "equal (|d| < 1e-12)" if abs(d) < 1e-12 else "moved"] += 1
    moved[fam].append(d)
    secs[fam][0] += float(r["train_seconds"])
    secs[fam][1] += float(old[name]["train_seconds"])
for fam in sorted({f for f, _ in count}):
    parts = ", ".join(f"{k} {count[fam, k]}" for f2, k in sorted(count) if f2 == fam)
    d = moved[fam]
    spread = (f"; validation NE here minus there: mean {statistics.mean(d):+.5f}, "
              f"sd {statistics.stdev(d):.5f}, range [{min(d):+.5f}, {max(d):+.5f}]"
              if any(abs(x) >= 1e-12 for x in d) else "")
    a, b = secs[fam]
    print(f"{fam:7s} {parts}{spread}; training {a / 60:.1f} vs {b / 60:.1f} core-min ({a / b:.3f}x)")
print("only in the old study:", ", ".join(n for n in old if n not in new) or "none")
total = sum(float(r["train_seconds"]) for r in new.values())
print(f"training here: {total / 60:.1f} core-min over {len(new)} runs")
