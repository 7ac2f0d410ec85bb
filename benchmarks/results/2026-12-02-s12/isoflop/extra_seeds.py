"""Extra seeds of a family at the largest budget at another learning rate, through the study's own code
(same resolved run config, training and evaluation as `opengem scale --design isoflop`). Session 12's copy of
session 10's script: its own output folder, and it simulates the study's stream when the folder has none.

    python extra_seeds.py FAMILY LR SEEDS [BUDGET]   e.g. dcnv2 0.003 1,2   (BUDGET: index, default the last)
"""
import sys
from pathlib import Path

from opengem.bench.isoflop import default_config_path, load_isoflop_config, train_cell

fam_name, lr, seeds = sys.argv[1], float(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")]
out = Path("/work/s12/iso/out")
cfg = load_isoflop_config(default_config_path("default"), families=[fam_name])
data = (out / "data") if (out / "data" / "_COMPLETE").exists() else None  # None: simulate the stream once
last = int(sys.argv[4]) if len(sys.argv) > 4 else len(cfg.budgets) - 1
train_cell(cfg, out, data, fam_name, 0, last, lr, seeds, log=lambda m: print(m, flush=True))
