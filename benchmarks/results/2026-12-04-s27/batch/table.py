"""Valid / test-slice NE of the batch-128 runs beside the study's batch-256 runs.

    python table.py STUDY PILOT_OUT
"""
import json
import sys
from pathlib import Path

import numpy as np


def ne(rec: dict, split: str) -> float:
    return (rec[split]["all/click"]["ne"] + rec[split]["all/conversion"]["ne"]) / 2


study, out = sys.argv[1:]
cells = sorted({p.name.rsplit("-seed", 1)[0] for p in Path(out, "runs").glob("*-seed*")})
print("| cell | valid NE bs 256 / 128 (mean of seeds 0-2) | test NE (slice) bs 256 / 128 "
      "| test 128 - 256, per seed |")
print("|---|---|---|---|")
for cell in cells:
    a = [json.loads(Path(study, "runs", f"{cell}-seed{s}", "result.json").read_text()) for s in range(3)]
    b = [json.loads(Path(out, "runs", f"{cell}-seed{s}", "result.json").read_text()) for s in range(3)]
    va, vb = np.mean([ne(r, "valid") for r in a]), np.mean([ne(r, "valid") for r in b])
    ta, tb = [ne(r, "test") for r in a], [ne(r, "test") for r in b]
    d = " / ".join(f"{y - x:+.4f}" for x, y in zip(ta, tb))
    print(f"| {cell} | {va:.4f} / {vb:.4f} | {np.mean(ta):.4f} / {np.mean(tb):.4f} | {d} |")
