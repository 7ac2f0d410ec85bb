"""The cross-width screen: each family with ``cross_width = 8`` minus without, paired over seeds, and GEM
minus DCNv2 in each arm.   python table.py OUT > table.md"""

import json
import sys
from pathlib import Path

import numpy as np

from opengem.bench.fit import mean_ci

TASKS = ("all/click", "all/conversion")
ARMS = ("gem", "gem_cw8", "dcnv2", "dcnv2_cw8")


def ne(out: Path, arm: str, seed: int, split: str) -> list[float]:
    m = json.loads((out / f"{arm}_seed{seed}.json").read_text())[split]["metrics"]
    return [m[t]["ne"] for t in TASKS]


def cell(d: np.ndarray) -> str:
    if len(d) < 2:
        return f"{d.mean():+.4f}" if len(d) else "-"
    m, h = mean_ci(d)
    lo, hi = m - h, m + h
    star = "**" if hi < 0 or lo > 0 else ""
    return f"{star}{m:+.4f} [{lo:+.4f}, {hi:+.4f}]{star}"


def diff(out: Path, a: str, b: str, seeds: list[int]) -> list[str]:
    cells = []
    for split in ("valid", "test"):
        d = np.array([np.subtract(ne(out, a, s, split), ne(out, b, s, split)) for s in seeds])
        cells += [cell(d[:, t]) for t in range(len(TASKS))]
    return cells


out = Path(sys.argv[1])
done = {a: [s for s in range(10) if (out / f"{a}_seed{s}.json").exists()] for a in ARMS}
print("paired 95 % t intervals over the seeds both arms have; bold: excludes 0\n")
print("| comparison | seeds | valid all/click | valid all/conversion | test all/click "
      "| test all/conversion |")
print("|---|---|---|---|---|---|")
for a, b in (("gem_cw8", "gem"), ("dcnv2_cw8", "dcnv2"), ("gem", "dcnv2"), ("gem_cw8", "dcnv2"),
             ("gem_cw8", "dcnv2_cw8")):
    seeds = sorted(set(done[a]) & set(done[b]))
    if seeds:
        print(f"| {a} minus {b} | {','.join(map(str, seeds))} | " + " | ".join(diff(out, a, b, seeds)) + " |")
print("\nvalidation NE per seed (all/click / all/conversion):")
for a in ARMS:
    print(f"  {a:10s} " + "; ".join(f"{s}: " + " / ".join(f"{v:.4f}" for v in ne(out, a, s, "valid"))
                                     for s in done[a]))
