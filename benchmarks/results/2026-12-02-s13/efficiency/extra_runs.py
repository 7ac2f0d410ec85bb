"""Runs of a family at one budget and learning rate, each ladder's s0, through the study's own code (same
resolved run config, training and evaluation as `opengem scale --design isoflop`), into session 12's study
folder (its 2.8M-row stream and runs). Session 12's extra_seeds.py with the folder as an argument.

    python extra_runs.py OUT FAMILY LR SEEDS BUDGET     e.g. /work/s12/iso/out dcnv2 0.001 0 3
"""
import sys
from pathlib import Path

from opengem.bench.isoflop import default_config_path, load_isoflop_config, train_cell

out = Path(sys.argv[1])
fam_name, lr, seeds = sys.argv[2], float(sys.argv[3]), [int(s) for s in sys.argv[4].split(",")]
cfg = load_isoflop_config(default_config_path("default"), families=[fam_name])
data = (out / "data") if (out / "data" / "_COMPLETE").exists() else None  # None: simulate the stream once
train_cell(cfg, out, data, fam_name, 0, int(sys.argv[5]), lr, seeds, log=lambda m: print(m, flush=True))
