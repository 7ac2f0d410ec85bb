"""A probe's cells against the study's own runs of the size they vary, seeds 0-2 (session 29).

    python table.py STUDY PROBE_OUT [PROBE_SIZE=STUDY_SIZE ...]   (default: s3=s0 s4=s1)

Each probe run PROBE_OUT/slr0.2/runs/<fam>-s<probe>-b<budget>-lr<rate>-seed<k> is paired with the study's run
<fam>-s<study>-b<budget>-lr<rate>-seed<k>; NE = mean of pooled click and conversion NE.
"""
import json
import sys
from pathlib import Path

import numpy as np

BUDGETS = {"b0": "5e9", "b1": "1.58e10", "b2": "5e10", "b3": "1.58e11"}
T_975_2DOF = 4.303


def ne(rec: dict, split: str) -> float:
    return (rec[split]["all/click"]["ne"] + rec[split]["all/conversion"]["ne"]) / 2


def main(study: Path, out: Path, pairs: dict[str, str]) -> None:
    cells = sorted({p.parent.name.rsplit("-seed", 1)[0] for p in out.glob("slr0.2/runs/*/result.json")},
                   key=lambda c: (c.split("-")[2], c.split("-")[0]))
    print("| family | budget | study size, rate | rows study / probe | valid NE study / probe | "
          "test slice study / probe | test probe minus study [95 %, paired] |")
    print("|---|---|---|---|---|---|---|")
    for cell in cells:
        fam, size, budget, lr = cell.split("-", 3)
        base = f"{fam}-{pairs[size]}-{budget}-{lr}"
        got = []
        for seed in range(3):
            a = out / "slr0.2" / "runs" / f"{cell}-seed{seed}" / "result.json"
            c = study / "runs" / f"{base}-seed{seed}" / "result.json"
            if a.exists() and c.exists():
                got.append((json.loads(c.read_text()), json.loads(a.read_text())))
        if not got:
            continue
        v = np.array([[ne(c, "valid"), ne(a, "valid")] for c, a in got])
        t = np.array([[ne(c, "test"), ne(a, "test")] for c, a in got])
        d = t[:, 1] - t[:, 0]
        half = T_975_2DOF * d.std(ddof=1) / np.sqrt(3) if len(d) == 3 else float("nan")
        rows = f"{got[0][0]['examples']:,} / {got[0][1]['examples']:,}"
        print(f"| {fam} | {BUDGETS[budget]} | {pairs[size]}, {lr[2:]} | {rows} | {v[:, 0].mean():.4f} / "
              f"{v[:, 1].mean():.4f} | {t[:, 0].mean():.4f} / {t[:, 1].mean():.4f} | {d.mean():+.4f} "
              f"[{d.mean() - half:+.4f}, {d.mean() + half:+.4f}] |")


if __name__ == "__main__":
    extra = dict(a.split("=") for a in sys.argv[3:]) or {"s3": "s0", "s4": "s1"}
    main(Path(sys.argv[1]), Path(sys.argv[2]), extra)
