"""Session 18's frontier (sessions 17-18's sizes at each budget's rate) against ladders with three more sizes
below each family's edge, and with each chosen size's rate re-chosen on validation.

Sessions 17-18's runs come from their committed outputs (session 17's read by
``../../2026-12-03-s18/ladder/compare_recent.py``, imported; session 18's from
``../../2026-12-03-s18/ladder/runs_s18.csv``); session 19's from run folders
(``NAME/result.json``), written to ``runs_s19.csv`` here. Per budget and family:

1. the size with the lowest seed-0 validation NE at the budget's rate (as session 17 chose it) is chosen,
   among all sizes (the study's rule; session 18's result when only its sizes are offered);
2. that size at the grid's other two rates (seed 0): the (size, rate) with the lowest validation NE is the
   cell, and its seeds' test NE make the point.

Test NE = mean of pooled click and conversion NE on the test day's first 16,384 rows; GEM minus each family
with a 95 % Welch interval; raw calibration of the chosen cells' seeds; the share of the DLRM -> oracle gap
GEM closes (the oracle NE of session 17's study on the same stream and slice).

    python compare_s19.py RUN_DIR [RUN_DIR ...] > compare_s19.txt
"""
import csv
import runpy
import sys
from pathlib import Path

from opengem.bench.fit import mean_ci

FAMILIES = ("gem", "dcnv2", "dlrm")
BUDGETS = {0: "5e10", 1: "1.58e11", 2: "5e11"}
GRID = (0.001, 0.003, 0.01)
here = Path(__file__).resolve().parent
s18 = here.parents[1] / "2026-12-03-s18" / "ladder"

# session 17's runs as session 18's script reads them (importing it runs only its reading of session 17's
# outputs: seed-0 validation NE per size at each budget's rate, the chosen cells' seeds, the oracle)
g = runpy.run_path(str(s18 / "compare_recent.py"), run_name="compare_recent")
RATE, oracle = g["RATE"], g["oracle"]
# ne[(budget, family, size, rate)] = {seed: (valid NE, test NE)}; session 17's test-only seeds have valid None
ne: dict[tuple[int, str, int, float], dict[int, tuple[float | None, float]]] = {}
for (b, f, s), seeds in g["test"].items():
    for seed, t in seeds.items():
        v = g["valid"].get((b, f, s)) if seed == 0 else None
        ne.setdefault((b, f, s, RATE[(b, f)]), {})[seed] = (v, t)
for (b, f, s), v in g["valid"].items():  # session 17's 5e11 sizes have seed-0 validation NE only
    cell = ne.setdefault((b, f, s, RATE[(b, f)]), {})
    cell[0] = (v, cell[0][1] if 0 in cell else float("nan"))
rows = []
with open(s18 / "runs_s18.csv") as fh:
    for r in csv.DictReader(fh):
        rows.append({k: (float(v) if k.startswith(("valid", "test", "lr")) else v) for k, v in r.items()})
for folder in sys.argv[1:]:
    for d in sorted(Path(folder).iterdir()):
        if (row := g["run_row"](d)) is not None:
            rows.append(row | {"session": 19})
for r in rows:
    key = (int(r["budget"]), r["family"], int(r["size"]), float(r["lr"]))
    ne.setdefault(key, {})[int(r["seed"])] = (r["valid_ne"], r["test_ne"])
new = [r for r in rows if r.get("session") == 19]
if new:
    with open(here / "runs_s19.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(new[0]))
        w.writeheader()
        w.writerows(new)


def seed0(key: tuple[int, str, int, float]) -> float | None:
    v = ne.get(key, {}).get(0)
    return v[0] if v and v[0] is not None else None


def test_ne(key: tuple[int, str, int, float]) -> list[float]:
    return [ne[key][s][1] for s in sorted(ne.get(key, {})) if ne[key][s][1] == ne[key][s][1]]


def point(key: tuple[int, str, int, float]) -> str:
    xs = test_ne(key)
    if not xs:
        return "no test NE"
    mean, half = mean_ci(xs) if len(xs) > 1 else (xs[0], float("nan"))
    return f"{mean:.4f} ± {half:.4f} ({len(xs)} seeds: " + ", ".join(f"{x:.4f}" for x in xs) + ")"


def report(b: int, label: str) -> None:
    print(f"== {label}")
    cells = {}
    for f in FAMILIES:
        rate = RATE[(b, f)]
        ranked = sorted((v, s) for (bb, ff, s, lr), _ in ne.items()
                        if bb == b and ff == f and lr == rate and (v := seed0((bb, ff, s, lr))) is not None)
        print(f"  seed-0 validation NE, {f} at {rate}: " + ", ".join(f"s{s} {v:.4f}" for v, s in ranked))
        size = ranked[0][1]
        rates = sorted((v, lr) for lr in GRID if (v := seed0((b, f, size, lr))) is not None)
        by_rate = sorted(rates, key=lambda x: x[1])
        print(f"  {f} s{size} at each rate: " + ", ".join(f"{lr:g} {v:.4f}" for v, lr in by_rate))
        cells[f] = (b, f, size, rates[0][1])
        if rates[0][1] != rate:  # the re-chosen rate's cell first, then the budget rate's for reference
            print(f"  {f}: s{size} at {rates[0][1]:g} (re-chosen): test NE {point(cells[f])}")
        print(f"  {f}: s{size} at {rate:g}: test NE {point((b, f, size, rate))}")
    for f in FAMILIES:
        cal = [r for r in rows if (int(r["budget"]), r["family"], int(r["size"]), float(r["lr"])) == cells[f]]
        if cal:
            pooled = [float(r[k]) for r in cal for k in ("test_cal_all_click", "test_cal_all_conversion")]
            lo = min(float(r["test_cal_cells_min"]) for r in cal)
            hi = max(float(r["test_cal_cells_max"]) for r in cal)
            print(f"  {f} calibration (raw, {len(cal)} seeds): pooled {min(pooled):.2f}-{max(pooled):.2f}, "
                  f"cells {lo:.2f}-{hi:.2f}")
    g["print_gap_and_differences"]({f: test_ne(cells[f]) for f in FAMILIES}, oracle)


for b, label in BUDGETS.items():
    report(b, label)
