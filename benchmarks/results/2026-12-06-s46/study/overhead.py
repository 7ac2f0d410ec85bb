"""Where a study's minutes went, against another study of the same runs: each run's training seconds (its
train_summary) and the rest of its wall time (start-up, validation and test scoring, calibration), from the
study's log (one line per run, its wall seconds last) and its isoflop_runs.csv.

    python overhead.py NEW/study.log NEW/isoflop_runs.csv OLD/study.log OLD/isoflop_runs.csv
"""

import csv
import re
import statistics
import sys

LINE = re.compile(r"isoflop: \[\d+\] (\S+) \(.*, ([\d.]+)s$")


def runs(log: str, table: str) -> dict[str, tuple[float, float]]:
    wall = {m[1]: float(m[2]) for m in map(LINE.match, open(log).read().splitlines()) if m}
    train = {r["name"]: float(r["train_seconds"]) for r in csv.DictReader(open(table))}
    return {n: (train[n], wall[n] - train[n]) for n in wall if n in train}


def main(new_log: str, new_csv: str, old_log: str, old_csv: str) -> None:
    new, old = runs(new_log, new_csv), runs(old_log, old_csv)
    both = sorted(set(new) & set(old))
    for label, r in (("new", new), ("old", old)):
        print(f"{label}: {len(r)} runs, training {sum(t for t, _ in r.values()) / 60:.1f} core-min, "
              f"the rest {sum(o for _, o in r.values()) / 60:.1f} core-min")
    print(f"the {len(both)} runs of both: training new/old "
          f"{sum(new[n][0] for n in both) / sum(old[n][0] for n in both):.3f} "
          f"(median per run {statistics.median(new[n][0] / old[n][0] for n in both):.3f}); "
          "the rest new - old "
          f"{sum(new[n][1] - old[n][1] for n in both) / 60:+.1f} core-min "
          f"(median per run {statistics.median(new[n][1] - old[n][1] for n in both):+.2f} s)")
    for fam in sorted({n.split("-")[0] for n in both}):
        ns = [n for n in both if n.startswith(fam + "-")]
        print(f"  {fam:<7} training new/old {sum(new[n][0] for n in ns) / sum(old[n][0] for n in ns):.3f}, "
              f"the rest per run {statistics.median(old[n][1] for n in ns):.2f} -> "
              f"{statistics.median(new[n][1] for n in ns):.2f} s (median)")


if __name__ == "__main__":
    main(*sys.argv[1:5])
