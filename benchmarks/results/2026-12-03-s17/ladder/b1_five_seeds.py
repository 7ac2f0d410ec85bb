"""1.58e11 with 5 seeds: the study's frontier cells (GEM s1, DCNv2 s4, DLRM s0, rate 3e-3; seeds 0-2 by the
study) plus seeds 3-4 trained with cell.py; test NE per family (95 % t) and GEM minus each (95 % Welch).

    python b1_five_seeds.py OUT/runs
"""
import json
import sys
from pathlib import Path

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop import selection_ne
from opengem.bench.isoflop_report import welch_difference

CELLS = {"gem": "gem-s1-b1-lr0.003", "dcnv2": "dcnv2-s4-b1-lr0.003", "dlrm": "dlrm-s0-b1-lr0.003"}
runs = Path(sys.argv[1])
ne = {f: [selection_ne(json.loads((runs / f"{c}-seed{s}" / "result.json").read_text())["test"], "tasks")
          for s in range(5)] for f, c in CELLS.items()}
for fam, v in ne.items():
    m, h = mean_ci(v)
    print(f"{fam}: {m:.4f} ± {h:.4f} (seeds {', '.join(f'{x:.4f}' for x in v)})")
for fam in ("dcnv2", "dlrm"):
    w = welch_difference(ne["gem"], ne[fam])
    lo, hi = w["ci95"]
    print(f"GEM minus {fam}: {w['diff']:+.4f} [{lo:+.4f}, {hi:+.4f}]{' *' if w['excludes_zero'] else ''}")
