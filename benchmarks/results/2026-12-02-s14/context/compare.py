"""Paired comparison of study runs with the same name (family, size, budget, rate, seed) in two folders: the
study's validation and test NE (result.json: mean of pooled click and conversion NE on 16,384-row slices),
and, where run_cal.sh has scored them, the whole test day before and after Platt calibration (NE and the
calibration of each surface x task cell).

    python compare.py BASE_RUNS VARIANT_RUNS [NAME_GLOB]
"""
import json
import sys
from pathlib import Path

import numpy as np

from opengem.bench.fit import mean_ci

base, var = Path(sys.argv[1]), Path(sys.argv[2])
pattern = sys.argv[3] if len(sys.argv) > 3 else "*"
pairs = [(b, var / b.name) for b in sorted(base.glob(pattern)) if (var / b.name / "result.json").exists()
         and (b / "result.json").exists()]


def study_ne(run: Path, split: str) -> float:
    m = json.loads((run / "result.json").read_text())[split]
    return (m["all/click"]["ne"] + m["all/conversion"]["ne"]) / 2


def day(run: Path, method: str) -> dict | None:
    f = run / f"{method}-eval-day=007.json"
    return json.loads(f.read_text())["metrics"] if f.exists() else None


def fmt(vals: list[float]) -> str:
    m, h = mean_ci(vals)
    return f"{m:+.4f} ± {h:.4f}" if len(vals) > 1 else f"{m:+.4f}"


print(f"{len(pairs)} pairs: {', '.join(b.name for b, _ in pairs)}")
print("| metric | base | variant | variant - base (mean ± 95 %) |")
print("|---|---|---|---|")
for split in ("valid", "test"):
    a = [study_ne(b, split) for b, _ in pairs]
    v = [study_ne(w, split) for _, w in pairs]
    print(f"| study {split} NE | {np.mean(a):.4f} | {np.mean(v):.4f} | {fmt(list(np.subtract(v, a)))} |")
for method in ("uncal", "platt"):
    got = [(day(b, method), day(w, method)) for b, w in pairs]
    got = [(x, y) for x, y in got if x is not None and y is not None]
    if not got:
        continue
    for key in ("all/click", "all/conversion"):
        a = [x[key]["ne"] for x, _ in got]
        v = [y[key]["ne"] for _, y in got]
        print(f"| whole test day {method} {key} NE ({len(got)}) | {np.mean(a):.4f} | {np.mean(v):.4f} | "
              f"{fmt(list(np.subtract(v, a)))} |")
    for key in sorted(got[0][0]):
        if key.startswith("all/click"):
            continue
        a = [x[key]["calibration"] for x, _ in got]
        v = [y[key]["calibration"] for _, y in got]
        print(f"| whole test day {method} {key} calibration | {min(a):.2f}-{max(a):.2f} | "
              f"{min(v):.2f}-{max(v):.2f} | |")
