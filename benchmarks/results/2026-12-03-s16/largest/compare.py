"""Session 15's ladder frontier (5e10, 1.58e11, 5e11; its isoflop.json) extended by the 1.58e12 runs of
largest.py: the frontier per family, GEM minus each family at 1.58e12 (95 % Welch, the study's), each family's
law NE = a C^-b + c refitted on its four frontier points, and the compute each baseline needs to reach GEM's
1.58e12 NE, over GEM's, with a 95 % bootstrap over seeds (the study's code: opengem.bench.isoflop_report).

    python compare.py RUNS_DIR...     (folders of largest.py runs: NAME/result.json)
"""
import json
import sys
from pathlib import Path

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop import selection_ne
from opengem.bench.isoflop_report import format_difference, format_laws, frontier_laws, welch_difference

FAMILIES = ("gem", "dcnv2", "dlrm")
study = json.loads((Path(__file__).resolve().parents[2] / "2026-12-02-s15" / "ladder" / "isoflop.json")
                   .read_text())
floor = study["oracle_ne"]
runs: dict[str, dict[float, list[tuple[int, float, float, float]]]] = {f: {} for f in FAMILIES}
for folder in sys.argv[1:]:
    for d in sorted(Path(folder).iterdir()):
        if not (d / "result.json").exists():
            continue
        fam, lr, seed = d.name.split("-")[0], float(d.name.split("-lr")[1].split("-")[0]), int(d.name[-1])
        r = json.loads((d / "result.json").read_text())
        c = 3.0 * r["flops_per_example"] * r["examples"]
        runs[fam].setdefault(lr, []).append((seed, selection_ne(r["valid"], "tasks"),
                                             selection_ne(r["test"], "tasks"), c))

points: dict[str, list[tuple[float, list[float]]]] = {}  # family -> [(training FLOPs, seeds' test NE)]
print("| family | 5e10 | 1.58e11 | 5e11 | 1.58e12 (rate: seed-0 validation NE by rate) |")
print("|---|---|---|---|---|")
for fam in FAMILIES:
    fr = study["frontier"][fam]
    points[fam] = [(p["train_flops"], list(p["ne_seeds"])) for p in fr]
    cells = [f"{p['ne']:.4f} ± {p['ne_ci95']:.4f}" for p in fr]
    by_rate = runs[fam]
    if by_rate:
        valid0 = {lr: next(v for s, v, _, _ in rs if s == 0) for lr, rs in by_rate.items()}
        best = min(valid0, key=valid0.get)
        nes = [t for _, _, t, _ in sorted(by_rate[best])]
        points[fam].append((by_rate[best][0][3], nes))
        m, h = mean_ci(nes)
        rates = ", ".join(f"{lr:g}: {v:.4f}" for lr, v in sorted(valid0.items()))
        cells.append(f"{m:.4f} ± {h:.4f} ({len(nes)} seeds at {best:g}; {rates})")
    print(f"| {fam} | " + " | ".join(cells) + " |")

print()
last = {f: p[-1][1] for f, p in points.items()}
for fam in FAMILIES[1:]:
    w = welch_difference(last["gem"], last[fam])
    print(f"GEM minus {fam} at the largest budget: {format_difference(w)}")

print()
print(format_laws(*frontier_laws(points, floor, "gem", 1000), "GEM", "1.58e12"))  # the study's bootstrap
