"""This session's largest-budget runs (GEM and DCNv2, s0, lr 3e-3) on the WHOLE test day.

`opengem evaluate --run RUN --partitions day=007` (350,000 rows; it writes RUN/eval-day=007.json) instead of
the study's 16,384-row slice: NE (mean of pooled click and conversion), GEM minus DCNv2 with the study's
Welch interval, calibration pooled and per cell against the issue's bands (pooled [0.95, 1.05], cells
[0.85, 1.15]), and the share of the DCNv2 -> oracle gap GEM closes (the oracle: the simulator's true
probabilities, scored on the same rows).

    python full_day.py RUNS_DIR
"""
import json
import sys
from pathlib import Path

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop_report import welch_difference

runs = Path(sys.argv[1])
POOLED = ("all/click", "all/conversion")
res: dict[str, list[dict]] = {"gem": [], "dcnv2": []}
for fam in res:
    for d in sorted(runs.glob(f"{fam}-s0-b3-lr0.003-seed*"), key=lambda p: int(p.name.rsplit("seed", 1)[1])):
        f = d / "eval-day=007.json"
        if f.exists():
            res[fam].append({"name": d.name, **json.loads(f.read_text())})


def ne(r: dict) -> float:
    return sum(r["metrics"][k]["ne"] for k in POOLED) / 2


def oracle_ne(r: dict) -> float:
    return sum(r["oracle"][k] for k in POOLED) / 2


print("| run | rows | NE (mean of pooled) | oracle NE | calibration click / conversion | cells min-max "
      "| cells outside [0.85, 1.15] |")
print("|---|---|---|---|---|---|---|")
for rs in res.values():
    for r in rs:
        m = r["metrics"]
        cells = {k: v["calibration"] for k, v in m.items() if not k.startswith("all/")}
        out = [f"{k} {v:.3f}" for k, v in cells.items() if not 0.85 <= v <= 1.15]
        print(f"| {r['name']} | {r['rows']:,} | {ne(r):.4f} | {oracle_ne(r):.4f} | "
              f"{m['all/click']['calibration']:.3f} / {m['all/conversion']['calibration']:.3f} | "
              f"{min(cells.values()):.3f}-{max(cells.values()):.3f} | {', '.join(out) or 'none'} |")
g, d = [ne(r) for r in res["gem"]], [ne(r) for r in res["dcnv2"]]
if len(g) > 1 and len(d) > 1:
    (mg, hg), (md, hd) = mean_ci(g), mean_ci(d)
    w = welch_difference(g, d)
    print(f"\nwhole test day: GEM {mg:.4f} ± {hg:.4f} ({len(g)} seeds), DCNv2 {md:.4f} ± {hd:.4f} "
          f"({len(d)} seeds); GEM minus DCNv2 {w['diff']:+.4f} [{w['ci95'][0]:+.4f}, {w['ci95'][1]:+.4f}]"
          + (" *" if w["excludes_zero"] else ""))
    o = oracle_ne(res["gem"][0])
    print(f"share of the DCNv2 -> oracle gap GEM closes (means): {(md - mg) / (md - o):.1%}")
