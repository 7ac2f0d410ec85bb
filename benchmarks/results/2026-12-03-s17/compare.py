"""The iso-FLOP frontier of session 15's ladders with every ladder extended below its smallest size.

5e10 and 1.58e11: the study rerun with the longer ladders (``ladder/ladder_down.toml``, its ``isoflop.json``).
5e11: session 15's runs (``../2026-12-02-s15/ladder/isoflop_runs.csv``) plus the new sizes trained there
(``ladder/ladder_5e11.toml``). 1.58e12: every run of the 6.4M-row stream (sessions 16 and 17, run folders).
At 5e11 and 1.58e12 each family's cell is chosen as the study chooses: the size and rate with the lowest
seed-0 validation NE; its seeds' test NE make the point. Then GEM minus each family (95 % Welch), the laws
NE = a C^-b + c refitted on the four points (plotted with the frontier to frontier.png), the compute each
baseline needs to reach GEM's largest-budget NE over GEM's (95 % bootstrap over seeds), and the share of the
DLRM -> oracle gap GEM closes there.

    python compare.py STUDY_JSON ORACLE_DATA RUN_DIR...
      STUDY_JSON   the 5e10 / 1.58e11 study's isoflop.json
      ORACLE_DATA  the 6.4M-row stream (its test day gives the 1.58e12 oracle), or "" to skip the gap
      RUN_DIR      folders of runs NAME/result.json (NAME = family-sSIZE-bBUDGET-lrRATE-seedSEED)
"""
import csv
import json
import re
import sys
from pathlib import Path

import numpy as np

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop import selection_ne
from opengem.bench.isoflop_report import format_difference, format_laws, frontier_laws, welch_difference
from opengem.bench.scaling_plot import plot_isoflop

FAMILIES = ("gem", "dcnv2", "dlrm")
NAME = re.compile(r"(\w+)-s(\d+)-b(\d+)-lr([0-9.e-]+)-seed(\d+)$")
here = Path(__file__).resolve().parent
study_json, oracle_data, run_dirs = sys.argv[1], sys.argv[2], sys.argv[3:]
study = json.loads(Path(study_json).read_text())
floor = study["oracle_ne"]

# cells[budget][family][(size, lr)] = {seed: (valid NE, test NE, training FLOPs)}; budgets 2, 3 only
cells: dict[int, dict[str, dict[tuple[int, float], dict[int, tuple[float, float, float]]]]] = {
    b: {f: {} for f in FAMILIES} for b in (2, 3)}
# calibration[(budget, family, size, lr, seed)] = {surface/task: mean prediction / observed rate}
calibration: dict[tuple[int, str, int, float, int], dict[str, float]] = {}
with open(here.parent / "2026-12-02-s15" / "ladder" / "isoflop_runs.csv") as fh:
    for r in csv.DictReader(fh):
        if int(r["budget"]) == 2:
            cells[2][r["family"]].setdefault((int(r["size"]), float(r["lr"])), {})[int(r["seed"])] = (
                float(r["valid_ne"]), float(r["test_ne"]), float(r["train_flops"]))
for folder in run_dirs:
    for d in sorted(Path(folder).iterdir()):
        m = NAME.match(d.name)
        if not m or not (d / "result.json").exists() or int(m[3]) not in (2, 3):
            continue
        r = json.loads((d / "result.json").read_text())
        fam, size, budget, lr, seed = m[1], int(m[2]), int(m[3]), float(m[4]), int(m[5])
        cells[budget][fam].setdefault((size, lr), {})[seed] = (
            selection_ne(r["valid"], "tasks"), selection_ne(r["test"], "tasks"),
            3.0 * r["flops_per_example"] * r["examples"])
        calibration[(budget, fam, size, lr, seed)] = {k: v["calibration"] for k, v in r["test"].items()}

points: dict[str, list[tuple[float, list[float]]]] = {}
chosen: dict[tuple[int, str], tuple[int, float, list[int]]] = {}
print("| family | 5e10 | 1.58e11 | 5e11 | 1.58e12 |")
print("|---|---|---|---|---|")
for fam in FAMILIES:
    points[fam] = [(p["train_flops"], list(p["ne_seeds"])) for p in study["frontier"][fam]]
    row = [f"s{p['size']}, {p['lr']:g}: {p['ne']:.4f} ± {p['ne_ci95']:.4f}" for p in study["frontier"][fam]]
    for b in (2, 3):
        seed0 = {k: v[0][0] for k, v in cells[b][fam].items() if 0 in v}
        if not seed0:
            row.append("-")
            continue
        best = min(seed0, key=seed0.get)
        seeds = cells[b][fam][best]
        nes = [seeds[s][1] for s in sorted(seeds)]
        points[fam].append((seeds[0][2], nes))
        chosen[(b, fam)] = (best[0], best[1], sorted(seeds))
        mean, half = mean_ci(nes) if len(nes) > 1 else (nes[0], float("nan"))
        row.append(f"s{best[0]}, {best[1]:g}: {mean:.4f} ± {half:.4f} ({len(nes)} seeds)")
    print(f"| {fam} | " + " | ".join(row) + " |")

print("\nSeed-0 validation NE of every (size, rate) tried at 5e11 and 1.58e12 (lowest first):")
for b in (2, 3):
    for fam in FAMILIES:
        seed0 = sorted((v[0][0], k) for k, v in cells[b][fam].items() if 0 in v)
        print(f"  b{b} {fam}: " + ", ".join(f"s{k[0]}@{k[1]:g} {v:.4f}" for v, k in seed0))

print("\nCalibration (mean prediction / observed rate, uncalibrated, test slice) of the chosen cells' seeds:")
for (b, fam), (size, lr, seeds) in chosen.items():
    cals = [calibration[(b, fam, size, lr, s)] for s in seeds if (b, fam, size, lr, s) in calibration]
    if cals:
        pooled = [c[k] for c in cals for k in c if k.startswith("all/")]
        cell = [c[k] for c in cals for k in c if not k.startswith("all/")]
        print(f"  b{b} {fam}: pooled {min(pooled):.2f}-{max(pooled):.2f}, "
              f"cells {min(cell):.2f}-{max(cell):.2f} ({len(cals)} seeds)")

print()
last = {f: p[-1][1] for f, p in points.items()}
for i, budget in enumerate(("5e10", "1.58e11", "5e11", "1.58e12")):
    for fam in FAMILIES[1:]:
        a, b = points["gem"][i][1], points[fam][i][1]
        if len(a) < 2 or len(b) < 2:
            continue
        print(f"{budget}: GEM minus {fam} {format_difference(welch_difference(a, b))}")

print()
fits, table = frontier_laws(points, floor, "gem", 1000)
print(format_laws(fits, table, "GEM", "1.58e12"))  # the study's bootstrap
plotted = {f: [dict(zip(("train_flops", "ne", "ne_ci95"), (c, *mean_ci(n)))) for c, n in p]
           for f, p in points.items()}
plot_isoflop({"frontier": plotted, "fits": {f: law.to_dict() for f, law in fits.items() if law},
              "oracle_ne": floor, "metric": "tasks"}, [], here / "frontier.png")

if oracle_data:
    from opengem.bench.size_ladder import oracle_with_totals

    oracle = oracle_with_totals(Path(oracle_data), "day=007")
    o = float(np.mean([oracle["all/click"], oracle["all/conversion"]]))
    g, d = float(np.mean(last["gem"])), float(np.mean(last["dlrm"]))
    print(f"\n1.58e12: oracle NE (mean of pooled click and conversion, whole test day) {o:.4f}; GEM closes "
          f"{(d - g) / (d - o):.1%} of the DLRM -> oracle gap ({d:.4f} -> {o:.4f})")
