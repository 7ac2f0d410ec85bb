"""Pilot (session 27): is the embedding tables' learning rate what holds GEM back at the small budgets?

Every iso-FLOP run tunes its dense learning rate on validation but trains its embedding tables (TorchRec's
fused row-wise Adagrad) at the recipe's fixed ``train.sparse_lr`` (0.2). With 100k-330k rows from one day, the
tables see few updates per id, so that rate may matter, and differently per family. Each cell below is trained
by the study's own worker (``opengem.bench.isoflop_worker``: its isoflop.toml's rows, steps, dense rate, seed,
latest days, Platt on the validation slice, 16,384-row test slice) with ``train.sparse_lr`` overridden, into
PILOT_OUT/slr<rate>/runs/; sparse_lr 0.2 is the study's own run.

    python run_pilot.py STUDY_OUT DATA PILOT_OUT SPARSE_LRS CELL...  (CELL = family:size:budget:lr, seeds 0-2)
    python run_pilot.py --table STUDY_OUT PILOT_OUT                  (the table: valid / test NE per cell)
"""
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np


def run_cells(study_out: str, data: str, out: Path, cells: list[str], override: str = "") -> None:
    """Seeds 0-2 of every CELL through the study's worker into ``out`` (PILOT_WORKERS at once)."""
    jobs = [(*c.split(":"), str(seed)) for c in cells for seed in range(3)]
    (out / "logs").mkdir(parents=True, exist_ok=True)

    def run(job: tuple) -> None:
        with open(out / "logs" / f"{'-'.join(job)}.txt", "w") as fh:
            args = [f"{study_out}/isoflop.toml", str(out), data, *job, *([override] if override else [])]
            code = subprocess.call([sys.executable, "-m", "opengem.bench.isoflop_worker", *args],
                                   stdout=fh, stderr=subprocess.STDOUT)
        print(*job, override, "exit", code, flush=True)

    with ThreadPoolExecutor(int(os.environ.get("PILOT_WORKERS", "1"))) as pool:
        list(pool.map(run, jobs))


def ne(rec: dict, split: str) -> float:
    m = rec[split]
    return (m["all/click"]["ne"] + m["all/conversion"]["ne"]) / 2


def table(study_out: str, out: str) -> None:
    by: dict[str, dict[float, dict[int, tuple[float, float]]]] = {}
    for d in [Path(study_out), *sorted(Path(out).glob("slr*"))]:
        slr = 0.2 if d == Path(study_out) else float(d.name[3:])
        for f in Path(out).glob("slr*/runs/*/result.json"):  # the cells the pilot ran
            cell, seed = f.parent.name.rsplit("-seed", 1)
            run = d / "runs" / f.parent.name / "result.json"
            if run.exists():
                rec = json.loads(run.read_text())
                by.setdefault(cell, {}).setdefault(slr, {})[int(seed)] = (ne(rec, "valid"), ne(rec, "test"))
    print("| cell | sparse_lr | seeds | valid NE (mean) | test NE (slice, mean) | test minus sparse_lr 0.2 "
          "(paired) |")
    print("|---|---|---|---|---|---|")
    for cell in sorted(by):
        for slr in sorted(by[cell]):
            runs = by[cell][slr]
            v = np.array([runs[s] for s in sorted(runs)])
            ref = by[cell].get(0.2, {})
            d = np.array([runs[s][1] - ref[s][1] for s in sorted(runs) if s in ref])
            diff = f"{d.mean():+.4f} ({len(d)} seeds)" if slr != 0.2 and len(d) else ""
            print(f"| {cell} | {slr:g} | {len(runs)} | {v[:, 0].mean():.4f} | {v[:, 1].mean():.4f} "
                  f"| {diff} |")


def main(argv: list[str]) -> None:
    if argv[0] == "--table":
        return table(argv[1], argv[2])
    study_out, data, out, slrs, *cells = argv
    for slr in slrs.split(","):
        run_cells(study_out, data, Path(out) / f"slr{slr}", cells, f"train.sparse_lr={slr}")


if __name__ == "__main__":
    main(sys.argv[1:])
