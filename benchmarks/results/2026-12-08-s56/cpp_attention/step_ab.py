"""GEM training step: the C++ attention core vs SDPA, interleaved windows in one process (CPU ms per step).

    .venv/bin/python benchmarks/results/2026-12-08-s56/cpp_attention/step_ab.py configs/small.toml \
        train.progress=false
"""
import os
import statistics
import sys
import time

import torch

import opengem.ops.cpp.cpp_attention as ca
from opengem.train.config import load_run_config
from opengem.train.data import prepare_data
from opengem.train.trainer import Trainer

built = ca.supports
arms = {"sdpa": lambda q, k: False, "cpp": built}
cfg = load_run_config(sys.argv[1], sys.argv[2:])
data = prepare_data(cfg.data, "runs/bench/small", None)
print("threads", torch.get_num_threads(), "cpp built", ca.available())
with Trainer(cfg, None, data) as trainer:
    it = iter(trainer.train_loader())
    batches = [next(it).to_device(trainer.device) for _ in range(8)]
    k = 0

    def steps(n: int) -> float:
        global k
        c = time.process_time()
        for _ in range(n):
            trainer.train_step(batches[k % 8])
            k += 1
        return (time.process_time() - c) / n * 1e3

    for fn in arms.values():
        ca.supports = fn
        steps(3)
    t: dict[str, list[float]] = {n: [] for n in arms}
    for _ in range(int(os.environ.get("ROUNDS", 7))):
        for n, fn in arms.items():
            ca.supports = fn
            t[n].append(steps(10))
    B = cfg.data.batch_size
    for n, ts in t.items():
        m = statistics.median(ts)
        print(f"{n:5s} cpu {m:7.1f} ms/step  {B / m * 1e3:6.0f} ex/s  windows {[round(x) for x in ts]}")
    print(f"cpp / sdpa step time {statistics.median(t['cpp']) / statistics.median(t['sdpa']):.3f}")
    print("load", os.getloadavg())
