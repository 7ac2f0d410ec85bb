"""Paired table of the demo_cross runs: .venv/bin/python table.py OUT [A B] (default base cross16)."""
import json
import sys
from pathlib import Path

import numpy as np

from opengem.bench.fit import mean_ci


def ne(r: dict, split: str) -> tuple[float, float]:
    m = r[split]["metrics"]
    return m["all/click"]["ne"], m["all/conversion"]["ne"]


out = Path(sys.argv[1])
a, b = (sys.argv[2], sys.argv[3]) if len(sys.argv) > 3 else ("base", "cross16")
rows = []
for s in range(10):
    fa, fb = out / f"{a}_seed{s}.json", out / f"{b}_seed{s}.json"
    if fa.exists() and fb.exists():
        ra, rb = json.loads(fa.read_text()), json.loads(fb.read_text())
        rows.append((s, ne(ra, "valid"), ne(rb, "valid"), ne(ra, "test"), ne(rb, "test"),
                     ra["steps"], rb["steps"], ra["flops_per_example"], rb["flops_per_example"]))
print(f"| seed | valid NE {a} (click / conv) | valid NE {b} | test NE {a} | test NE {b} |")
print("|---|---|---|---|---|")
for s, va, vb, ta, tb, *_ in rows:
    print(f"| {s} | {va[0]:.4f} / {va[1]:.4f} | {vb[0]:.4f} / {vb[1]:.4f} | {ta[0]:.4f} / {ta[1]:.4f} | "
          f"{tb[0]:.4f} / {tb[1]:.4f} |")
if rows:
    r0 = rows[0]
    print(f"\nsteps {r0[5]} vs {r0[6]}; forward FLOPs/example {r0[7]} vs {r0[8]}; training FLOPs ratio "
          f"{r0[6] * r0[8] / (r0[5] * r0[7]):.4f}")
for split, i in (("valid", 1), ("test", 3)):
    for t, task in enumerate(("click", "conversion")):
        d = np.array([r[i + 1][t] - r[i][t] for r in rows])
        if len(d) > 1:
            m, h = mean_ci(d)
            print(f"{split} all/{task}: {b} minus {a} {m:+.4f} [{m - h:+.4f}, {m + h:+.4f}] "
                  f"(paired, {len(d)} seeds)")
