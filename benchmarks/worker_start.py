"""What a study's process per run costs: one tiny iso-FLOP study (configs/isoflop-small.toml, DLRM's
two smallest sizes, two budgets, two seeds: six runs of a few hundred rows, two at a time) trained twice on
the same data, each run started as ``python -m`` (the study before session 43) and each forked from the
preloaded server (bench/worker_process.py). The runs are so small that the wall is almost all start-up; the
NE of every run must agree between the two.

    python benchmarks/worker_start.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import csv
import os
import tempfile
import time
from pathlib import Path

from opengem.bench import worker_process
from opengem.bench.isoflop import load_isoflop_config, run_study

ISO_SMALL = Path(__file__).resolve().parents[1] / "configs" / "isoflop-small.toml"
OVER = ["budgets=[1.0e8, 4.0e8]", "seeds=2", "lr_grid=[]", "lr_check=false", "bootstrap=5", "min_steps=1",
        "frontier_test_rows=-1", "workers=2"]
EXTRA = ["data.sim.rows=8000", "data.eval_batch_size=4096"]


def study(out: Path, data: Path | None) -> tuple[float, dict[str, float], int]:
    cfg = load_isoflop_config(ISO_SMALL, OVER, ["dlrm"])
    cfg.families[0].sizes = cfg.families[0].sizes[:2]
    t0 = time.perf_counter()
    res = run_study(cfg, out, data, run_overrides=EXTRA, log=lambda m: None)
    wall = time.perf_counter() - t0
    with open(out / "isoflop_runs.csv") as f:
        ne = {r["name"]: float(r["valid_ne"]) for r in csv.DictReader(f)}
    return wall, ne, int(res["runs_trained_now"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        worker_process._context = False  # every run as python -m, as before
        _, _, _ = study(root / "data_maker", None)  # the stream, generated once (not timed)
        data = root / "data_maker" / "data"
        rows = []
        for rep in range(a.repeats):
            for arm in ("python -m", "forked"):
                worker_process._context = False if arm == "python -m" else None
                wall, ne, n = study(root / f"{arm.replace(' ', '')}{rep}", data)
                rows.append((arm, rep, wall, n, ne))
    load = os.getloadavg()[0]
    print(f"load {load:.2f} (1-minute average at the end)")
    print("| runs started as | repeat | runs trained | wall s | s per run (2 at a time) |")
    print("|---|---|---|---|---|")
    for arm, rep, wall, n, _ in rows:
        print(f"| {arm} | {rep} | {n} | {wall:.1f} | {wall / max(n, 1) * 2:.1f} |")
    nes = [ne for *_, ne in rows]
    same = all(ne == nes[0] for ne in nes)
    print(f"every run's validation NE identical across arms and repeats: {same}")


if __name__ == "__main__":
    main()
