"""Per surface: the ratio of mean predicted conversion in the first 12 hours of the validation day (day 6) to
the last 12, against the same ratio of the simulator's true probabilities; plus each run's validation and
test NE from result.json (the study's 16,384-row slices). Predictions come from `opengem predict`.

    python hour_pattern.py DATA TAG=GLOB[,GLOB...] ...     (GLOB: run folders, e.g. 'runs/gem-*-seed[345]')
"""
import glob
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop import selection_ne

data = Path(sys.argv[1])
day = ds.dataset(data / "day=006", format="parquet").to_table(
    columns=["example_id", "surface", "hour_of_day"])
truth = ds.dataset(data / "truth" / "day=006", format="parquet").to_table()
assert (truth["example_id"].to_numpy() == day["example_id"].to_numpy()).all()
surface, first = day["surface"].to_numpy(), day["hour_of_day"].to_numpy() < 0.5
names = ["feed", "stories", "video", "messaging"]


def ratios(p: np.ndarray) -> list[float]:
    return [float(p[(surface == s) & first].mean() / p[(surface == s) & ~first].mean()) for s in range(4)]


print("| runs | seeds | valid NE | test NE | " + " | ".join(f"{n} conv 1st/2nd half" for n in names) + " |")
print("|---|---|---|---|" + "---|" * 4)
print("| truth | | | | " + " | ".join(f"{r:.3f}" for r in ratios(truth["p_conversion"].to_numpy())) + " |")
for arg in sys.argv[2:]:
    tag, dirs = arg.split("=", 1)
    runs = sorted(Path(r) for g in dirs.split(",") for r in glob.glob(g)
                  if (Path(r) / "result.json").exists())
    valid, test, rs = [], [], []
    for run in runs:
        rec = json.loads((run / "result.json").read_text())
        valid.append(selection_ne(rec["valid"], "tasks"))
        test.append(selection_ne(rec["test"], "tasks"))
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "p.parquet"
            subprocess.run([sys.executable, "-m", "opengem.cli", "predict", "--run", str(run), "--partitions",
                            "day=006", "--out", str(out)], check=True, capture_output=True)
            t = pq.read_table(out)
        assert (t["example_id"].to_numpy() == day["example_id"].to_numpy()).all()
        rs.append(ratios(t["conversion"].to_numpy()))
    mv, hv = mean_ci(valid)
    mt, ht = mean_ci(test)
    r = np.array(rs)
    print(f"| {tag} | {len(runs)} | {mv:.4f} ± {hv:.4f} | {mt:.4f} ± {ht:.4f} | "
          + " | ".join(f"{r[:, s].mean():.3f} ({r[:, s].min():.3f}-{r[:, s].max():.3f})" for s in range(4))
          + " |", flush=True)
