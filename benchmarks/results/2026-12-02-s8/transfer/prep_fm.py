"""Session 8: train the FM versions (and simulate the data) of some seeds of a transfer config into OUT,
in-process, exactly as `opengem transfer` would at its start (SeedRun construction)."""

import sys
import time
import warnings
from pathlib import Path

from opengem.train.distributed import process_group
from opengem.train.env import cpu_threads, resolve_device
from opengem.transfer.experiment_config import load_experiment_config
from opengem.transfer.seed_run import SeedRun

cfg_path, out, seeds = sys.argv[1], Path(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")]
warnings.filterwarnings("ignore", category=FutureWarning)
cfg = load_experiment_config(cfg_path, [])
cfg.validate()
dev = resolve_device(cfg.train.device)
t0 = time.perf_counter()
with process_group(dev) as pg, cpu_threads(cfg.threads):
    for s in seeds:
        r = SeedRun(cfg, s, out, dev, pg)
        print(
            f"seed {s}: {len(r.versions)} versions, fm {r.fm_train_s:.0f}s, "
            f"total {time.perf_counter() - t0:.0f}s",
            flush=True,
        )
