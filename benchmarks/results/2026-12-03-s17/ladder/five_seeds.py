"""A budget's frontier cells with 5 seeds: seeds 0-2 by the study (run folders, or session 15's runs CSV where
its run folders are gone) plus seeds 3-4 trained with cell.py; test NE per family (95 % t) and GEM minus each
(95 % Welch).

    python five_seeds.py OUT/runs gem-s1-b1-lr0.003 dcnv2-s4-b1-lr0.003 dlrm-s0-b1-lr0.003   # 1.58e11
    python five_seeds.py OUT/runs gem-s3-b2-lr0.01 dcnv2-s0-b2-lr0.003 dlrm-s4-b2-lr0.003    # 5e11
"""
import csv
import json
import sys
from pathlib import Path

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop import selection_ne
from opengem.bench.isoflop_report import format_difference, welch_difference

runs, cells = Path(sys.argv[1]), sys.argv[2:]
with open(Path(__file__).resolve().parents[2] / "2026-12-02-s15" / "ladder" / "isoflop_runs.csv") as fh:
    s15 = {r["name"]: float(r["test_ne"]) for r in csv.DictReader(fh)}


def test_ne(name: str) -> float:
    path = runs / name / "result.json"
    return selection_ne(json.loads(path.read_text())["test"], "tasks") if path.exists() else s15[name]


ne = {c.split("-")[0]: [test_ne(f"{c}-seed{s}") for s in range(5)] for c in cells}
for fam, v in ne.items():
    m, h = mean_ci(v)
    print(f"{fam}: {m:.4f} ± {h:.4f} (seeds {', '.join(f'{x:.4f}' for x in v)})")
for fam in list(ne)[1:]:
    print(f"GEM minus {fam}: {format_difference(welch_difference(ne['gem'], ne[fam]))}")
