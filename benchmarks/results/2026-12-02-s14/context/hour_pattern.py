"""Does a model learn each surface's hour-of-day cycle? Per surface and task: mean prediction in the first
12 hours of the validation day (day 6) over the last 12, next to the same ratio of the simulator's true
probabilities (../../2026-12-02-s13/dense_path/hour_pattern.py, for both tasks, predictions kept in each
run as pred-day=006.parquet so a second call is cheap).

    python hour_pattern.py DATA TAG=GLOB[,GLOB...] ...     (GLOB: run folders)
"""
import glob
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq

data = Path(sys.argv[1])
day = ds.dataset(data / "day=006", format="parquet").to_table(
    columns=["example_id", "surface", "hour_of_day"])
truth = ds.dataset(data / "truth" / "day=006", format="parquet").to_table()
assert (truth["example_id"].to_numpy() == day["example_id"].to_numpy()).all()
surface, first = day["surface"].to_numpy(), day["hour_of_day"].to_numpy() < 0.5
names = ["feed", "stories", "video", "messaging"]
TASKS = ("click", "conversion")


def ratios(p: np.ndarray) -> list[float]:
    return [float(p[(surface == s) & first].mean() / p[(surface == s) & ~first].mean()) for s in range(4)]


def predictions(run: Path) -> dict[str, np.ndarray]:
    out = run / "pred-day=006.parquet"
    if not out.exists():
        subprocess.run([sys.executable, "-m", "opengem.cli", "predict", "--run", str(run), "--partitions",
                        "day=006", "--out", str(out)], check=True, capture_output=True)
    t = pq.read_table(out)
    assert (t["example_id"].to_numpy() == day["example_id"].to_numpy()).all()
    return {k: t[k].to_numpy() for k in TASKS}


cols = [f"{n} {t[:4]}" for t in TASKS for n in names]
print("| runs | n | " + " | ".join(cols) + " |")
print("|---|---|" + "---|" * len(cols))
print("| truth | | " + " | ".join(f"{r:.3f}" for t in TASKS for r in ratios(truth[f"p_{t}"].to_numpy()))
      + " |", flush=True)
for arg in sys.argv[2:]:
    tag, globs = arg.split("=", 1)
    runs = sorted(Path(r) for g in globs.split(",") for r in glob.glob(g)
                  if (Path(r) / "result.json").exists())
    rs = np.array([[r for t in TASKS for r in ratios(p[t])] for p in map(predictions, runs)])
    print(f"| {tag} | {len(runs)} | " + " | ".join(f"{rs[:, j].mean():.3f}" for j in range(rs.shape[1]))
          + " |", flush=True)
