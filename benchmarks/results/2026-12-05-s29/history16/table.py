"""Probe table: each family's study choice (8 latest events) vs the same size reading 16, 3 seeds."""
import json, sys
from pathlib import Path
import numpy as np
STUDY, OUT = Path(sys.argv[1]), Path(sys.argv[2])
base_of = {"s3": "s0", "s4": "s1"}
budgets = {"b1": "1.58e10", "b2": "5e10", "b3": "1.58e11"}
def ne(r, s): return (r[s]["all/click"]["ne"] + r[s]["all/conversion"]["ne"]) / 2
cells = sorted({p.parent.name.rsplit("-seed", 1)[0] for p in OUT.glob("slr0.2/runs/*/result.json")})
print("| family | budget | size, rate | rows 8 / 16 events | valid NE 8 events | valid NE 16 events | test slice 8 / 16 | test 16 minus 8 (paired, 95 % t) |")
print("|---|---|---|---|---|---|---|---|")
for cell in sorted(cells, key=lambda c: (c.split("-")[2], c.split("-")[0])):
    fam, s, b, lr = cell.split("-", 3)
    base = f"{fam}-{base_of[s]}-{b}-{lr}"
    v16, v8, t16, t8, rows = [], [], [], [], None
    for seed in range(3):
        a = OUT / "slr0.2" / "runs" / f"{cell}-seed{seed}" / "result.json"
        c = STUDY / "runs" / f"{base}-seed{seed}" / "result.json"
        if not (a.exists() and c.exists()):
            continue
        ra, rc = json.loads(a.read_text()), json.loads(c.read_text())
        v16.append(ne(ra, "valid")); v8.append(ne(rc, "valid")); t16.append(ne(ra, "test")); t8.append(ne(rc, "test"))
        rows = (rc["examples"], ra["examples"])
    if not v16:
        continue
    d = np.array(t16) - np.array(t8)
    half = 4.303 * d.std(ddof=1) / np.sqrt(len(d)) if len(d) == 3 else float("nan")
    print(f"| {fam} | {budgets[b]} | {base_of[s]}, {lr[2:]} | {rows[0]:,} / {rows[1]:,} | {np.mean(v8):.4f} | "
          f"{np.mean(v16):.4f} | {np.mean(t8):.4f} / {np.mean(t16):.4f} | {d.mean():+.4f} [{d.mean()-half:+.4f}, {d.mean()+half:+.4f}] |")
