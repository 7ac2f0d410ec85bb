"""Each budget's size chosen on three seeds instead of one (the study's new ``size_seeds = 3``,
``size_finalists = 3``), on session 19's ladders and stream.

Session 19's rule: the size with the lowest seed-0 validation NE at the budget's rate. Here the three sizes
with the lowest seed-0 validation NE (the finalists) have seeds 0-2, and the lowest mean validation NE over
those seeds is the budget's size; its test NE over every seed it has makes the point (the rate is the
budget's rate, as session 19 chose it for the size selection; session 19's rate re-check applies only where
the choice is unchanged).

Sessions 17-19's runs come from session 19's script (imported; it reads sessions 17-18's committed outputs)
and ``../../2026-12-03-s19/ladder/runs_s19.csv``; session 20's from run folders, written to ``runs_s20.csv``.

    python compare_s20.py RUN_DIR [RUN_DIR ...] > compare_s20.txt
"""
import contextlib
import csv
import io
import runpy
import sys
from pathlib import Path

from opengem.bench.fit import mean_ci

here = Path(__file__).resolve().parent
s19 = here.parents[1] / "2026-12-03-s19" / "ladder"
argv, sys.argv = sys.argv, [str(s19 / "compare_s19.py")]
with contextlib.redirect_stdout(io.StringIO()):  # its report is compare_s19.txt; only its tables are wanted
    g = runpy.run_path(str(s19 / "compare_s19.py"), run_name="compare_s19")
sys.argv = argv
ne, RATE, oracle, FAMILIES, BUDGETS = g["ne"], g["RATE"], g["oracle"], g["FAMILIES"], g["BUDGETS"]
run_row = g["g"]["run_row"]
print_gap_and_differences = g["g"]["print_gap_and_differences"]


def add(r: dict) -> None:
    key = (int(r["budget"]), r["family"], int(r["size"]), float(r["lr"]))
    ne.setdefault(key, {})[int(r["seed"])] = (float(r["valid_ne"]), float(r["test_ne"]))


def load_runs(folders: list[Path], csv_out: Path) -> None:
    """Session 19's runs (runs_s19.csv) and the folders' into ``ne``; the folders' rows to ``csv_out``."""
    with open(s19 / "runs_s19.csv") as fh:
        for r in csv.DictReader(fh):
            add(r)
    new = []
    for folder in folders:
        for d in sorted(Path(folder).iterdir()):
            if (row := run_row(d)) is not None:
                new.append(row)
                add(row)
    if new:
        with open(csv_out, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(new[0]))
            w.writeheader()
            w.writerows(new)


SEEDS = (0, 1, 2)


def point(xs: list[float]) -> str:
    mean, half = mean_ci(xs) if len(xs) > 1 else (xs[0], float("nan"))
    return f"{mean:.4f} ± {half:.4f} ({len(xs)} seeds)"


def report() -> None:
    for b, label in BUDGETS.items():
        print(f"== {label}")
        test = {}
        for f in FAMILIES:
            rate = RATE[(b, f)]
            seed0 = sorted((v[0][0], s) for (bb, ff, s, lr), v in ne.items()
                           if (bb, ff, lr) == (b, f, rate) and 0 in v and v[0][0] is not None)
            finalists = [s for _, s in seed0[:3]]
            means = {}
            for s in finalists:
                got = ne[(b, f, s, rate)]
                vals = [got[k][0] for k in SEEDS if k in got and got[k][0] is not None]
                means[s] = (sum(vals) / len(vals), len(vals))
            old, chosen = finalists[0], min(finalists, key=lambda s: means[s][0])
            print(f"  {f} at {rate:g}: finalists (mean validation NE over seeds 0-2): "
                  + ", ".join(f"s{s} {m:.4f} (seed 0 {ne[(b, f, s, rate)][0][0]:.4f}, {n} seeds)"
                              for s, (m, n) in sorted(means.items(), key=lambda kv: kv[1][0])))
            # session 19's rate re-check: the chosen size's seed-0 validation NE at each rate it has
            tried = [(ne[k][0][0], lr) for lr in g["GRID"] if (k := (b, f, chosen, lr)) in ne and 0 in ne[k]]
            best_rate = min(tried)[1]
            cell = ne[(b, f, chosen, best_rate)]
            test[f] = [cell[k][1] for k in sorted(cell)]
            same = "the same as session 19's" if chosen == old else f"session 19's rule chose s{old}"
            print(f"  {f}: s{chosen} at {best_rate:g} ({same}; rates tried {len(tried)}): "
                  f"test NE {point(test[f])}; "
                  "the finalists' test NE at the budget's rate: "
                  + ", ".join(f"s{s} {point([v[1] for v in ne[(b, f, s, rate)].values()])}"
                              for s in finalists))
        print_gap_and_differences(test, oracle)


if __name__ == "__main__":
    load_runs([Path(p) for p in sys.argv[1:]], here / "runs_s20.csv")
    report()
