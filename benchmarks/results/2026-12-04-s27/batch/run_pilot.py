"""Pilot (session 27): does GEM, behind DCNv2 at the latest-window study's small budgets, need more steps?

Each cell is trained by the study's own worker (``opengem.bench.isoflop_worker``: its isoflop.toml's dense
rate, seed, latest days, Platt on the validation slice, 16,384-row slices) at ``data.batch_size=128``
instead of 256, into PILOT_OUT/runs/: the study's rule for rows at that batch (the budget's rows rounded to
whole batches of 128, so within 128 rows of the study's) in twice the optimizer steps. Batch 256 is the
study's own run.

    python run_pilot.py STUDY_OUT DATA PILOT_OUT CELL...   (CELL = family:size:budget:lr; seeds 0-2)
    python table.py STUDY_OUT PILOT_OUT
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sparse_lr"))
from run_pilot import run_cells  # noqa: E402  (the sparse-lr pilot's launcher: the study's worker, seeds 0-2)

if __name__ == "__main__":
    study_out, data, out, *cells = sys.argv[1:]
    os.environ.setdefault("PILOT_WORKERS", "2")
    run_cells(study_out, data, Path(out), cells, "data.batch_size=128")
