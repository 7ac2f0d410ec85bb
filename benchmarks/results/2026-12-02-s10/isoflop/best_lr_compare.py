"""GEM's frontier at the largest budget against DCNv2 and DLRM at the learning rate their lr-check found
best there (lower than the one chosen at the smallest budget), 3 seeds each, test NE (mean of pooled
click and conversion NE), GEM minus baseline with the study's 95 % Welch t interval.

    python best_lr_compare.py RUNS_DIR
"""
import json
import sys
from pathlib import Path

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop import selection_ne
from opengem.bench.isoflop_report import welch_difference

runs = Path(sys.argv[1])
groups = {"gem (frontier, lr 3e-3)": "gem-s0-b3-lr0.003-seed{}",
          "dcnv2 at lr 3e-3 (frontier: 1e-2)": "dcnv2-s0-b3-lr0.003-seed{}",
          "dcnv2 at lr 1e-2 (the frontier)": "dcnv2-s0-b3-lr0.01-seed{}",
          "dlrm at lr 1e-3 (frontier: 3e-3)": "dlrm-s0-b3-lr0.001-seed{}",
          "dlrm at lr 3e-3 (the frontier)": "dlrm-s0-b3-lr0.003-seed{}"}
ne, cal = {}, {}
for g, pat in groups.items():
    recs = [json.loads((runs / pat.format(s) / "result.json").read_text()) for s in range(3)]
    ne[g] = [selection_ne(r["test"], "tasks") for r in recs]
    cal[g] = [(r["test"]["all/click"].get("calibration"), r["test"]["all/conversion"].get("calibration"))
              for r in recs]
gem = next(iter(ne))
print("| runs at C = 1.58e12 (s0 of each ladder) | test NE per seed | mean ± 95 % "
      "| GEM minus it [95 % Welch] | pooled calibration click / conversion (mean) |")
print("|---|---|---|---|---|")
for g, v in ne.items():
    m, h = mean_ci(v)
    d = ""
    if g != gem:
        r = welch_difference(ne[gem], v)
        d = f"{r['diff']:+.4f} [{r['ci95'][0]:+.4f}, {r['ci95'][1]:+.4f}]"
        d += " *" if r["excludes_zero"] else ""
    cc = [sum(c[i] for c in cal[g]) / 3 for i in (0, 1)]
    seeds = ", ".join(f"{x:.4f}" for x in v)
    print(f"| {g} | {seeds} | {m:.4f} ± {h:.4f} | {d} | {cc[0]:.3f} / {cc[1]:.3f} |")
