"""Whole test day (day=007) of session 12's iso-FLOP runs, before and after `opengem calibrate` fitted on
the validation day (day=006): NE (mean of pooled click and conversion NE, the study's metric), calibration
(mean prediction / observed rate) pooled and per cell, and GEM minus DCNv2 with 95 % Welch intervals.

    python summary.py RUNS_DIR      # each run folder holds uncal-, platt- and offset-eval-day=007.json
"""
import json
import sys
from pathlib import Path

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop_report import welch_difference

runs = Path(sys.argv[1])
METHODS = ("uncal", "platt", "offset")
BUDGETS = {3: "1.58e12", 2: "5e11"}
data: dict[tuple[str, int, str, str], list[dict]] = {}  # (family, budget, lr, method) -> per-seed metrics
for d in sorted(runs.iterdir()):
    fam, _size, b, lr, _seed = d.name.split("-")
    for m in METHODS:
        f = d / f"{m}-eval-day=007.json"
        if f.exists():
            data.setdefault((fam, int(b[1:]), lr[2:], m), []).append(json.loads(f.read_text())["metrics"])


def ne(metrics: dict) -> float:
    return (metrics["all/click"]["ne"] + metrics["all/conversion"]["ne"]) / 2


def span(vals: list[float]) -> str:
    return f"{min(vals):.3f}-{max(vals):.3f}"


print("| budget | family (lr) | runs | calibration | NE (mean ± 95 %) | pooled click cal "
      "| pooled conversion cal | cells outside [0.85, 1.15] (runs) |")
print("|---|---|---|---|---|---|---|---|")
for b, label in BUDGETS.items():
    for (fam, bb, lr, m), seeds in sorted(data.items(),
                                          key=lambda kv: (kv[0][0], kv[0][2], METHODS.index(kv[0][3]))):
        if bb != b:
            continue
        mean, half = mean_ci([ne(x) for x in seeds])
        out: dict[str, int] = {}
        for x in seeds:
            for k, v in x.items():
                c = v.get("calibration")
                if not k.startswith("all/") and c is not None and not 0.85 <= c <= 1.15:
                    out[k] = out.get(k, 0) + 1
        cells = ", ".join(f"{k} ({n})" for k, n in sorted(out.items())) or "none"
        print(f"| {label} | {fam} ({lr}) | {len(seeds)} | {m} | {mean:.4f} ± {half:.4f} "
              f"| {span([x['all/click']['calibration'] for x in seeds])} "
              f"| {span([x['all/conversion']['calibration'] for x in seeds])} | {cells} |")
print()
print("| budget | DCNv2 lr | calibration | GEM minus DCNv2 [95 % Welch] |")
print("|---|---|---|---|")
for b, label in BUDGETS.items():
    for lr in ("0.003", "0.01"):
        for m in METHODS:
            g, d = data.get(("gem", b, "0.003", m)), data.get(("dcnv2", b, lr, m))
            if not g or not d or len(g) < 2 or len(d) < 2:
                continue
            r = welch_difference([ne(x) for x in g], [ne(x) for x in d])
            star = " *" if r["excludes_zero"] else ""
            lo, hi = r["ci95"]
            print(f"| {label} | {lr} | {m} | {r['diff']:+.4f} [{lo:+.4f}, {hi:+.4f}]{star} |")
