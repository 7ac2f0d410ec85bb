"""CPU ms per training step and minor page faults per step of one model, in a fresh process (so that glibc's
malloc settings, read from the environment at start, apply). ``TAG`` names the arm in the output line.

    TAG=default python steps.py configs/small-d32.toml gem
    TAG=mmap32M MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 python steps.py ... gem
"""

import os
import resource
import statistics
import sys
import time

from opengem.train.config import load_run_config
from opengem.train.data import prepare_data
from opengem.train.trainer import Trainer

cfgpath, model = sys.argv[1], sys.argv[2]
cfg = load_run_config(cfgpath, [f"model.name={model}"])
data = prepare_data(cfg.data, "/tmp/s54/gk", None)
with Trainer(cfg, None, data) as trainer:
    it = iter(trainer.train_loader())
    batches = [next(it) for _ in range(8)]
    for b in batches[:5]:
        trainer.train_step(b)
    windows = []
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        s = time.process_time()
        for k in range(10):
            trainer.train_step(batches[k % 8])
        windows.append((time.process_time() - s) / 10 * 1e3)
    f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    print(f"{model} {os.environ.get('TAG', 'default')} cpu ms/step median {statistics.median(windows):.1f} "
          f"min {min(windows):.1f} faults/step {(f1 - f0) / 50:.0f}", flush=True)
