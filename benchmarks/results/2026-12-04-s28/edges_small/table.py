"""The small-budget edges pilot's table: per family and budget, the study's sizes at the budget's rate and the
pilot's new sizes, validation and test-slice NE (mean of pooled click and conversion NE) over seeds 0-2.

    python table.py STUDY_OUT PILOT_OUT
"""
import json
import re
import sys
from pathlib import Path

import numpy as np

NAME = re.compile(r"(?P<fam>[a-z0-9]+)-s(?P<size>\d+)-b(?P<budget>\d+)-lr(?P<lr>[0-9.e-]+)-seed(?P<seed>\d+)")


def ne(rec: dict, split: str) -> float:
    return (rec[split]["all/click"]["ne"] + rec[split]["all/conversion"]["ne"]) / 2


def runs(folder: Path) -> dict[tuple, dict[int, tuple[float, float, int]]]:
    out: dict[tuple, dict[int, tuple[float, float, int]]] = {}
    for f in folder.glob("*/result.json"):
        m = NAME.fullmatch(f.parent.name)
        if m:
            rec = json.loads(f.read_text())
            key = (m["fam"], int(m["budget"]), m["lr"], int(m["size"]))
            seed = int(m["seed"])
            out.setdefault(key, {})[seed] = (ne(rec, "valid"), ne(rec, "test"), rec.get("examples", 0))
    return out


def main(study: str, pilot: str) -> None:
    new = runs(Path(pilot) / "slr0.2" / "runs")
    old = runs(Path(study) / "runs")
    print("| family | budget | lr | size | source | seeds | rows | valid NE (mean) | test NE (slice, mean) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for fam, budget, lr in sorted({k[:3] for k in new}):
        rows = [(k[3], "study", v) for k, v in old.items() if k[:3] == (fam, budget, lr)]
        rows += [(k[3], "pilot", v) for k, v in new.items() if k[:3] == (fam, budget, lr)]
        for size, src, v in sorted(rows, key=lambda r: np.mean([x[0] for x in r[2].values()])):
            a = np.array([v[s][:2] for s in sorted(v)])
            print(f"| {fam} | {budget} | {lr} | s{size} | {src} | {len(v)} | {v[min(v)][2]} "
                  f"| {a[:, 0].mean():.4f} | {a[:, 1].mean():.4f} |")


if __name__ == "__main__":
    main(*sys.argv[1:])
