"""The match-features screen: each family with the counts minus the recipe (session 37's daily arm), paired
over seeds, and GEM minus each baseline when every family has them.   python table.py OUT > table.md"""

import json
import sys
from pathlib import Path

import numpy as np

from opengem.bench.fit import mean_ci

TASKS = ("all/click", "all/conversion")
BASE = Path(__file__).resolve().parents[2] / "2026-12-05-s37" / "demo_chrono" / "runs"


def ne(path: Path, split: str) -> list[float]:
    m = json.loads(path.read_text())[split]["metrics"]
    return [m[t]["ne"] for t in TASKS]


def cell(d: np.ndarray) -> str:
    m, h = mean_ci(d)
    lo, hi = m - h, m + h
    star = "**" if hi < 0 or lo > 0 else ""
    return f"{star}{m:+.4f} [{lo:+.4f}, {hi:+.4f}]{star}"


out = Path(sys.argv[1])
FAMILIES = ("gem", "dcnv2", "dlrm")
seeds = [s for s in range(5) if all((out / f"{f}_match_seed{s}.json").exists() for f in FAMILIES)]
print(f"seeds {seeds}; paired 95 % t intervals; bold: excludes 0\n")
print("| family | valid all/click: counts minus recipe | valid all/conversion | test all/click "
      "| test all/conversion | valid NE with counts (click / conv) |")
print("|---|---|---|---|---|---|")
for fam in ("gem", "dcnv2", "dlrm"):
    pairs = [(BASE / f"{fam}_daily_seed{s}.json", out / f"{fam}_match_seed{s}.json") for s in seeds]
    cells = []
    for split in ("valid", "test"):
        d = np.array([np.subtract(ne(b, split), ne(a, split)) for a, b in pairs])
        cells += [cell(d[:, t]) for t in range(len(TASKS))]
    v = np.mean([ne(b, "valid") for _, b in pairs], axis=0)
    print(f"| {fam} | {' | '.join(cells)} | {v[0]:.4f} / {v[1]:.4f} |")
print("\nGEM minus each baseline, every family with the counts (without them: the recipe's runs):\n")
print("| baseline | arm | valid all/click | valid all/conversion | test all/click | test all/conversion |")
print("|---|---|---|---|---|---|")
for fam in ("dcnv2", "dlrm"):
    for arm, folder, tag in (("with counts", out, "match"), ("recipe", BASE, "daily")):
        cells = []
        for split in ("valid", "test"):
            d = np.array([np.subtract(ne(folder / f"gem_{tag}_seed{s}.json", split),
                                      ne(folder / f"{fam}_{tag}_seed{s}.json", split)) for s in seeds])
            cells += [cell(d[:, t]) for t in range(len(TASKS))]
        print(f"| {fam} | {arm} | {' | '.join(cells)} |")
print("\nper seed (valid all/click, with counts): " + "; ".join(
    f"seed {s}: " + ", ".join(f"{f} {ne(out / f'{f}_match_seed{s}.json', 'valid')[0]:.4f}"
                              for f in ("gem", "dcnv2", "dlrm")) for s in seeds))
