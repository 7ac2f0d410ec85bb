"""Extra seeds of a family at the largest budget at another learning rate, through the study's own code
(same resolved run config, training and evaluation as `opengem scale --design isoflop`).

    python extra_seeds.py FAMILY LR SEEDS   e.g. dcnv2 0.003 1,2
"""
import sys
from pathlib import Path

from opengem.bench.isoflop import default_config_path, load_isoflop_config, train_cell

fam_name, lr, seeds = sys.argv[1], float(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")]
out = Path("/work/s10/isorun/out")
cfg = load_isoflop_config(default_config_path("default"), families=[fam_name])
train_cell(cfg, out, out / "data", fam_name, 0, len(cfg.budgets) - 1, lr, seeds,
           log=lambda m: print(m, flush=True))
