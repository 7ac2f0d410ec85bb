"""GEM vs DCNv2 at the iso-FLOP study's largest budget (C = 1.58e12, each ladder's s0, both at lr 3e-3):
session 10's seeds 0-2 (read from ../../2026-12-02-s10/isoflop/best_lr_compare.txt) and this session's
seeds 3-8 (RUNS_DIR, trained by extra_seeds.py through the study's own code). Test NE = the mean of pooled
click and conversion NE on the test day's first 16,384 rows; 95 % Welch t intervals (the study's).

    python more_seeds.py RUNS_DIR
"""
import json
import sys
from pathlib import Path

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop import selection_ne
from opengem.bench.isoflop_report import welch_difference

runs = Path(sys.argv[1])
s10 = Path(__file__).resolve().parents[2] / "2026-12-02-s10" / "isoflop" / "best_lr_compare.txt"
rows = {line.split("|")[1].strip(): line.split("|")[2] for line in s10.read_text().splitlines()
        if line.startswith("| gem (frontier") or line.startswith("| dcnv2 at lr 3e-3")}
old = {"gem": [float(x) for x in rows["gem (frontier, lr 3e-3)"].split(",")],
       "dcnv2": [float(x) for x in rows["dcnv2 at lr 3e-3 (frontier: 1e-2)"].split(",")]}
new: dict[str, list[float]] = {}
seeds: dict[str, list[int]] = {}
cal: dict[str, list[tuple[float, float, float, float]]] = {}
for fam in ("gem", "dcnv2"):
    for d in sorted(runs.glob(f"{fam}-s0-b3-lr0.003-seed*"), key=lambda p: int(p.name.rsplit("seed", 1)[1])):
        if int(d.name.rsplit("seed", 1)[1]) < 3 or not (d / "result.json").exists():
            continue
        t = json.loads((d / "result.json").read_text())["test"]
        seeds.setdefault(fam, []).append(int(d.name.rsplit("seed", 1)[1]))
        new.setdefault(fam, []).append(selection_ne(t, "tasks"))
        cells = [v["calibration"] for k, v in t.items() if not k.startswith("all/") and v.get("calibration")]
        cal.setdefault(fam, []).append((t["all/click"]["calibration"], t["all/conversion"]["calibration"],
                                        min(cells), max(cells)))


def line(name: str, a: list[float], b: list[float]) -> str:
    ma, ha = mean_ci(a)
    mb, hb = mean_ci(b)
    r = welch_difference(a, b)
    star = " *" if r["excludes_zero"] else ""
    return (f"| {name} | {len(a)} / {len(b)} | {ma:.4f} ± {ha:.4f} | {mb:.4f} ± {hb:.4f} | "
            f"{r['diff']:+.4f} [{r['ci95'][0]:+.4f}, {r['ci95'][1]:+.4f}]{star} |")


print("| seeds | runs GEM / DCNv2 | GEM test NE (mean ± 95 %) | DCNv2 at lr 3e-3 "
      "| GEM minus DCNv2 [95 % Welch] |")
print("|---|---|---|---|---|")
print(line("session 10: 0-2", old["gem"], old["dcnv2"]))
print(line(f"this session: GEM {seeds['gem']}, DCNv2 {seeds['dcnv2']}", new["gem"], new["dcnv2"]))
print(line("all", old["gem"] + new["gem"], old["dcnv2"] + new["dcnv2"]))
print()
for fam in ("gem", "dcnv2"):
    print(f"{fam} new seeds test NE: " + ", ".join(f"{x:.4f}" for x in new[fam]))
    print(f"{fam} calibration (pooled click, pooled conversion, lowest cell, highest cell) per new seed: "
          + "; ".join(", ".join(f"{x:.3f}" for x in c) for c in cal[fam]))
