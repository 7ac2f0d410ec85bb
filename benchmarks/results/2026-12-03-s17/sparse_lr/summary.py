"""The embedding (sparse, row-wise Adagrad) learning rate at 1.58e11, every family's frontier cell of
``../ladder/`` (GEM s1, DCNv2 s4, DLRM s0, dense rate 3e-3), seeds 0-2: 0.05 and 0.8 beside the recipe's 0.2
(the study's own runs). Mean validation NE per rate (the choice), and test NE with paired 95 % intervals.

    python summary.py STUDY_RUNS SLR_OUT      (SLR_OUT/<rate>/runs/NAME/result.json)
"""
import json
import sys
from pathlib import Path

import numpy as np

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop import selection_ne

CELLS = {"gem": "gem-s1-b1-lr0.003", "dcnv2": "dcnv2-s4-b1-lr0.003", "dlrm": "dlrm-s0-b1-lr0.003"}
RATES = ("0.05", "0.2", "0.8")
study_runs, out = Path(sys.argv[1]), Path(sys.argv[2])


def scores(folder: Path, prefix: str) -> tuple[list[float], list[float]]:
    rs = [json.loads((folder / f"{prefix}-seed{s}" / "result.json").read_text()) for s in range(3)]
    return [selection_ne(r["valid"], "tasks") for r in rs], [selection_ne(r["test"], "tasks") for r in rs]


print("| family | sparse lr | validation NE (mean of 3) | test NE ± 95 % | test minus 0.2 (paired) |")
print("|---|---|---|---|---|")
for fam, prefix in CELLS.items():
    base = scores(study_runs, prefix)
    for rate in RATES:
        valid, test = base if rate == "0.2" else scores(out / rate / "runs", prefix)
        m, h = mean_ci(test)
        diff = "" if rate == "0.2" else "{:+.4f} ± {:.4f}".format(*mean_ci(list(np.subtract(test, base[1]))))
        print(f"| {fam} | {rate} | {np.mean(valid):.4f} | {m:.4f} ± {h:.4f} | {diff} |")
