"""The training-step benchmark: throughput, model FLOPs, MFU, peak memory and time to first step.

The step measured is the trainer's own: ``Trainer.train_step`` of a :class:`~opengem.train.trainer.Trainer`
built from the config (DMP-wrapped, fused row-wise Adagrad on the tables, AdamW on dense parameters,
gradient clipping, LR schedule) on real batches from the run's dataset, so ``train.precision``,
``train.fp8_saved_activations`` and ``train.compile`` apply here exactly as in training.

Conventions (reported in the output under ``conventions``):
- throughput excludes data loading: a pool of real batches is read first and cycled, so examples/s is
  the model step's rate; the loader's own rate is reported separately (``loader_examples_per_s``);
- examples/s is the median over ``windows`` timed windows of ``steps`` steps each, after ``warmup`` steps;
- model FLOPs per example = 3 x the model's analytic forward FLOPs (``flops_per_example()``, at full
  sequence length): backward costs two forwards, embedding lookups count zero. The FlopCounterMode
  forward FLOPs on a real batch (sequences as long as they really are) are reported beside it
  (``measured_fwd_flops_per_example``), with the MFU they imply;
- time to first step runs from the start of the Trainer's construction (process group, model build,
  sharding plan, optimizers) to the end of the first optimizer step, including reading the first batch.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any

from opengem.bench.machine import PeakMemory, load_average, matmul_peak, sync
from opengem.errors import TrainError, UsageError
from opengem.model.flops import measured_flops, model_flops
from opengem.train.config import RunConfig
from opengem.train.data import prepare_data
from opengem.train.env import resolve_device
from opengem.train.trainer import Trainer

CONVENTIONS = {
    "flops_per_example": "3 x analytic forward FLOPs at full sequence length (fwd + bwd), lookups = 0",
    "examples_per_s": "median of timed windows after warm-up; batches pre-read and cycled (no data loading)",
    "peak_flops": "best n^3 matmul (7 before, 3 after each window, 7 after) in the same process and threads "
                  "(fp32 1024^3 on CPU, bf16 4096^3 on GPU)",
    "peak_mem_mb": "CPU: peak RSS (VmHWM, reset via /proc/self/clear_refs) - RSS at start, one model per "
                   "process (freed heap is reused, so earlier work in the process lowers it); "
                   "GPU: max_memory_allocated",
    "time_to_first_step_s": "Trainer construction start -> end of first optimizer step (incl. first batch)",
}


def bench_train(cfg: RunConfig, run_dir: str | Path, data_dir: str | Path | None = None, *,
                steps: int = 20, warmup: int = 5, windows: int = 5, pool: int = 16,
                peak_n: int | None = None) -> dict[str, Any]:
    """Benchmark one model's training step; returns the result dict (see module docstring)."""
    if steps < 1 or windows < 1 or warmup < 0 or pool < 1:
        raise UsageError(f"bench: need steps >= 1, windows >= 1, warmup >= 0, pool >= 1 "
                         f"(got {steps}, {windows}, {warmup}, {pool})")
    cfg.validate()
    data_path = prepare_data(cfg.data, run_dir, data_dir)
    mem = PeakMemory(resolve_device(cfg.train.device))
    mem.start()
    t0 = time.perf_counter()
    # no run folder: nothing is written, so several models can be benchmarked over the same data
    with Trainer(cfg, None, data_path) as trainer:
        device = trainer.device
        loader = iter(trainer.train_loader())
        try:
            first = next(loader).to(device)
        except StopIteration:
            raise TrainError(f"{data_path}: partitions {cfg.data.train!r} gave no full batch of "
                             f"{cfg.data.batch_size} rows (lower data.batch_size)") from None
        loss0 = trainer.train_step(first)
        sync(device)
        ttfs = time.perf_counter() - t0
        peak = matmul_peak(device, peak_n)

        batches = [first]
        t_load = time.perf_counter()
        for b in loader:
            batches.append(b.to(device))
            if len(batches) >= pool:
                break
        load_s = time.perf_counter() - t_load
        loader_rate = (len(batches) - 1) * cfg.data.batch_size / load_s if len(batches) > 1 else None

        for i in range(warmup):
            trainer.train_step(batches[i % len(batches)])
        sync(device)
        rates, k = [], warmup
        for _ in range(windows):
            tw = time.perf_counter()
            for _ in range(steps):
                trainer.train_step(batches[k % len(batches)])
                k += 1
            sync(device)
            rates.append(steps * cfg.data.batch_size / (time.perf_counter() - tw))
            # sample the peak between windows too: on a shared machine the quiet moments are brief
            between = matmul_peak(device, peak_n, repeats=3)
            if between["peak_flops"] > peak["peak_flops"]:
                peak = {**between, "peak_flops_median": peak["peak_flops_median"]}
        memory = mem.stop()
        after = matmul_peak(device, peak_n)  # the best of before and after: load may change during the run
        if after["peak_flops"] > peak["peak_flops"]:
            peak = after
        if not math.isfinite(trainer.last_loss):
            raise TrainError(f"bench: loss became {trainer.last_loss} (lower train.lr)")
        plain, model = trainer.parallel.plain, trainer.model
        fwd = model_flops(plain)
        measured_fwd = measured_flops(model, batches[0])
        model.train()
        dense_list = trainer.optimizers.dense
        ds = trainer.ds

    eps = statistics.median(rates)
    fpe = 3 * fwd
    achieved = eps * fpe
    return {
        "model": cfg.model.name,
        "examples_per_s": eps,
        "flops_per_example": fpe,
        "achieved_flops": achieved,
        "peak_flops": peak["peak_flops"],
        "mfu": achieved / peak["peak_flops"],
        "peak_mem_mb": memory["peak_mem_mb"],
        "time_to_first_step_s": ttfs,
        "fwd_flops_per_example": fwd,
        "measured_fwd_flops_per_example": measured_fwd,
        "mfu_measured_flops": eps * 3 * measured_fwd / peak["peak_flops"],
        "window_examples_per_s": rates,
        "loader_examples_per_s": loader_rate,
        "first_loss": float(loss0),
        "dense_params": sum(p.numel() for p in dense_list),
        "embedding_params": sum(v * d for v, d in ds.schema.tables().values()),
        "batch_size": cfg.data.batch_size, "steps": steps, "warmup": warmup, "windows": windows,
        "pool_batches": len(batches), "device": str(device),
        "threads": peak["peak_threads"] if device.type == "cpu" else None,
        "peak_flops_median": peak["peak_flops_median"], "peak_n": peak["peak_n"],
        "peak_dtype": peak["peak_dtype"],
        "peak_mem_abs_mb": memory["peak_mem_abs_mb"], "peak_mem_method": memory["peak_mem_method"],
        "load_average": load_average(), "data": str(data_path), "conventions": CONVENTIONS,
    }
