"""A variant against the base at C = 1.58e11, each family's frontier cell of session 15's ladder study, paired
by seed: here the embedding init (model.embedding.init_scale = 1.0: every table U(+-1/sqrt(d)), against
TorchRec's default U(+-sqrt(1/rows)), which starts 1M-row tables near zero); ../batch/ the batch size. Base
seeds 0-2 are the study's own runs (its isoflop_runs.csv; they reproduce exactly), the rest are read from the
run folders given.

    python compare.py LABEL RUNS_DIR...   (folders holding NAME/result.json; a folder whose path contains
                                           LABEL holds the variant's runs, any other base runs)
    e.g. python compare.py init1 BASE_RUNS INIT1_RUNS
"""
import csv
import json
import statistics as st
import sys
from pathlib import Path

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop import selection_ne

CELLS = {"gem": "gem-s1-b1-lr0.003", "dcnv2": "dcnv2-s0-b1-lr0.003", "dlrm": "dlrm-s0-b1-lr0.003"}
ne: dict[tuple[str, str, str], float] = {}  # (variant, split, run name) -> NE
study = Path(__file__).resolve().parents[2] / "2026-12-02-s15" / "ladder" / "isoflop_runs.csv"
with open(study) as f:
    for row in csv.DictReader(f):
        for split in ("valid", "test"):
            ne["base", split, row["name"]] = float(row[f"{split}_ne"])
label = sys.argv[1]
for folder in sys.argv[2:]:
    variant = "variant" if label in folder else "base"
    for d in Path(folder).iterdir():
        if (d / "result.json").exists():
            r = json.loads((d / "result.json").read_text())
            for split in ("valid", "test"):
                ne[variant, split, d.name] = selection_ne(r[split], "tasks")

print(f"| family (cell) | split | seeds | base mean | {label} mean | difference [95 % t, paired] |")
print("|---|---|---|---|---|---|")
for fam, prefix in CELLS.items():
    for split in ("valid", "test"):
        seeds = [s for s in range(10)
                 if all((v, split, f"{prefix}-seed{s}") in ne for v in ("base", "variant"))]
        if len(seeds) < 2:
            continue
        b = [ne["base", split, f"{prefix}-seed{s}"] for s in seeds]
        v = [ne["variant", split, f"{prefix}-seed{s}"] for s in seeds]
        d = [y - x for x, y in zip(b, v)]
        m, h = mean_ci(d)
        print(f"| {fam} ({prefix}) | {split} | {len(seeds)} | {st.mean(b):.4f} (sd {st.stdev(b):.4f}) | "
              f"{st.mean(v):.4f} (sd {st.stdev(v):.4f}) | {m:+.4f} [{m - h:+.4f}, {m + h:+.4f}] |")
