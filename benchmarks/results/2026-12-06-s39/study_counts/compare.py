"""The chosen 1.58e11 cells with the history counts against the same cells of session 34's study (no counts):
validation and test NE on the study's 16,384-row slices (test through Platt fitted on the validation slice, as
every study run is scored before the frontier's whole-day pass), all/click and all/conversion.

    python compare.py OUT S34/isoflop_runs_gem.csv S27/isoflop_runs.csv
    (S34 = ../../2026-12-05-s34/study: GEM's cells; S27 = ../../2026-12-04-s27/fresh: the baselines' cells,
    which session 34's frontier reused)
"""

import csv
import json
import sys
from pathlib import Path

import numpy as np

from opengem.bench.fit import mean_ci

TASKS = ("all/click", "all/conversion")
CELLS = (("gem", "gem-s4-b3-lr0.01"), ("dcnv2", "dcnv2-s1-b3-lr0.003"), ("dlrm", "dlrm-s1-b3-lr0.003"))


def new(out: Path, name: str) -> dict[str, float]:
    r = json.loads((out / "runs" / name / "result.json").read_text())
    return {f"{split} {t}": r[split][t]["ne"] for split in ("valid", "test") for t in TASKS}


def old(rows: dict[str, dict[str, str]], name: str) -> dict[str, float]:
    r = rows[name]
    return {f"test {t}": float(r[f"test_ne[{t}]"]) for t in TASKS} | {"valid": float(r["valid_ne"])}


out = Path(sys.argv[1])
rows = {r["name"]: r for table in sys.argv[2:] for r in csv.DictReader(open(table))}
print("| family | seeds | valid click (counts) | valid conv (counts) | test click: counts / none "
      "| test conv: counts / none |")
print("|---|---|---|---|---|---|")
got = {}
for fam, cell in CELLS:
    seeds = [s for s in range(3) if (out / "runs" / f"{cell}-seed{s}" / "result.json").exists()]
    n = [new(out, f"{cell}-seed{s}") for s in seeds]
    o = [old(rows, f"{cell}-seed{s}") for s in seeds]
    got[fam] = (n, seeds)
    cells = [f"{np.mean([x[f'valid {t}'] for x in n]):.4f}" for t in TASKS]
    cells += [f"{np.mean([x[f'test {t}'] for x in n]):.4f} / {np.mean([x[f'test {t}'] for x in o]):.4f}"
              for t in TASKS]
    print(f"| {fam} | {seeds} | " + " | ".join(cells) + " |")
print("\nGEM minus each baseline with the counts, paired by seed (mean, 95 % t half-width):\n")
for fam in ("dcnv2", "dlrm"):
    seeds = sorted(set(got["gem"][1]) & set(got[fam][1]))
    for key in ("valid all/click", "valid all/conversion", "test all/click", "test all/conversion"):
        g, b = got["gem"], got[fam]
        d = [g[0][g[1].index(s)][key] - b[0][b[1].index(s)][key] for s in seeds]
        m, h = mean_ci(d)
        print(f"- GEM - {fam}, {key}: {m:+.4f} +- {h:.4f} (seeds {seeds})")
