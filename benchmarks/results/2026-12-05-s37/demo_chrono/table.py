"""Paired table of the demo_chrono runs, an arm minus shuffled: python table.py OUT [chrono|daily]."""
import json
import sys
from pathlib import Path

import numpy as np

from opengem.bench.fit import mean_ci

TASKS = ("all/click", "all/conversion")


def ne(path: Path, split: str) -> list[float]:
    m = json.loads(path.read_text())[split]["metrics"]
    return [m[t]["ne"] for t in TASKS]


out = Path(sys.argv[1])
arm = sys.argv[2] if len(sys.argv) > 2 else "chrono"
print(f"| family | seeds | valid all/click: {arm} minus shuffled | valid all/conversion | "
      "test all/click | test all/conversion | valid NE shuffled (click / conv) |")
print("|---|---|---|---|---|---|---|")
per_seed = []
for fam in ("gem", "dcnv2", "dlrm"):
    pairs = [(out / f"{fam}_base_seed{s}.json", out / f"{fam}_{arm}_seed{s}.json") for s in range(5)]
    pairs = [(a, b) for a, b in pairs if a.exists() and b.exists()]
    cells = []
    for split in ("valid", "test"):
        d = np.array([np.subtract(ne(b, split), ne(a, split)) for a, b in pairs])
        for t in range(len(TASKS)):
            m, h = mean_ci(d[:, t]) if len(d) > 1 else (float(d[0, t]), float("nan"))
            cells.append(f"{m:+.4f} [{m - h:+.4f}, {m + h:+.4f}]" if split == "valid" else f"{m:+.4f}")
    base = np.mean([ne(a, "valid") for a, _ in pairs], 0)
    print(f"| {fam} | {len(pairs)} | " + " | ".join(cells) + f" | {base[0]:.4f} / {base[1]:.4f} |")
    for s, (a, b) in enumerate(pairs):
        per_seed.append((fam, s, ne(a, "valid"), ne(b, "valid"), ne(a, "test"), ne(b, "test")))
print(f"\n| family | seed | valid shuffled | valid {arm} | test shuffled | test {arm} |")
print("|---|---|---|---|---|---|")
for fam, s, va, vb, ta, tb in per_seed:
    print(f"| {fam} | {s} | " + " | ".join(f"{x[0]:.4f} / {x[1]:.4f}" for x in (va, vb, ta, tb)) + " |")
