"""GEM vs DCNv2 at the iso-FLOP study's two largest budgets with more seeds (each ladder's s0, the size the
study chose there). Session 10's runs are read from its committed files (`isoflop_runs.csv`; for DCNv2 at
lr 3e-3 at the largest budget, `best_lr_compare.txt`, whose seeds 1-2 were extra runs); this session's from
RUNS_DIR (`extra_seeds.py`, the study's own code). Test NE = the mean of pooled click and conversion NE on
the test day's first 16,384 rows; 95 % Welch t intervals (the study's).

    python more_seeds.py RUNS_DIR
"""
import csv
import json
import sys
from pathlib import Path

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop import selection_ne
from opengem.bench.isoflop_report import welch_difference

runs = Path(sys.argv[1])
s10 = Path(__file__).resolve().parents[2] / "2026-12-02-s10" / "isoflop"
BUDGETS = {3: "C = 1.58e12", 2: "C = 5e11"}

ne: dict[str, float] = {}  # run name -> test NE
source: dict[str, str] = {}
cal: dict[str, tuple[float, ...]] = {}
with open(s10 / "isoflop_runs.csv") as f:
    for row in csv.DictReader(f):
        ne[row["name"]] = float(row["test_ne"])
        source[row["name"]] = "s10"
for line in (s10 / "best_lr_compare.txt").read_text().splitlines():
    if line.startswith("| dcnv2 at lr 3e-3"):
        for seed, x in enumerate(line.split("|")[2].split(",")):
            ne[f"dcnv2-s0-b3-lr0.003-seed{seed}"] = float(x)
            source[f"dcnv2-s0-b3-lr0.003-seed{seed}"] = "s10"
for d in runs.iterdir():
    if (d / "result.json").exists():
        t = json.loads((d / "result.json").read_text())["test"]
        ne[d.name], source[d.name] = selection_ne(t, "tasks"), "s12"
        cells = [v["calibration"] for k, v in t.items() if not k.startswith("all/") and v.get("calibration")]
        cal[d.name] = (t["all/click"]["calibration"], t["all/conversion"]["calibration"],
                       min(cells), max(cells))


def group(fam: str, budget: int, lr: str) -> tuple[list[float], list[str]]:
    names = sorted((n for n in ne if n.startswith(f"{fam}-s0-b{budget}-lr{lr}-seed")),
                   key=lambda n: int(n.rsplit("seed", 1)[1]))
    return [ne[n] for n in names], names


print("| budget | GEM (lr 3e-3) | DCNv2 at lr | runs GEM / DCNv2 (s10 + s12) | GEM test NE (mean ± 95 %) "
      "| DCNv2 | GEM minus DCNv2 [95 % Welch] |")
print("|---|---|---|---|---|---|---|")
for b, label in BUDGETS.items():
    g, gn = group("gem", b, "0.003")
    for lr in ("0.003", "0.01"):
        d, dn = group("dcnv2", b, lr)
        if len(d) < 2 or len(g) < 2:
            continue
        (mg, hg), (md, hd) = mean_ci(g), mean_ci(d)
        r = welch_difference(g, d)
        star = " *" if r["excludes_zero"] else ""
        count = (f"{sum(source[n] == 's10' for n in gn)}+{sum(source[n] == 's12' for n in gn)} / "
                 f"{sum(source[n] == 's10' for n in dn)}+{sum(source[n] == 's12' for n in dn)}")
        print(f"| {label} | s0 | {lr} | {count} | {mg:.4f} ± {hg:.4f} | {md:.4f} ± {hd:.4f} | "
              f"{r['diff']:+.4f} [{r['ci95'][0]:+.4f}, {r['ci95'][1]:+.4f}]{star} |")
print()
for n in sorted(ne, key=lambda n: (n.split("-b")[1][0], n)):
    if source[n] == "s12" or n.startswith(("gem-s0-b3-lr0.003", "dcnv2-s0-b3-lr0.003", "gem-s0-b2-lr0.003",
                                            "dcnv2-s0-b2-lr0.01")):
        c = ", ".join(f"{x:.3f}" for x in cal[n]) if n in cal else ""
        extra = f"  calibration click, conv, cells {c}" if c else ""
        print(f"{n:32s} {source[n]}  test NE {ne[n]:.4f}{extra}")
