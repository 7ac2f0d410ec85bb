"""The training-step benchmark: throughput, model FLOPs, MFU, peak memory and time to first step.

The step measured is the trainer's own: ``Trainer.train_step`` of a :class:`~opengem.train.trainer.Trainer`
built from the config (DMP-wrapped, fused row-wise Adagrad on the tables, AdamW on dense parameters,
gradient clipping, LR schedule) on real batches from the run's dataset, so ``train.precision``,
``train.fp8_saved_activations`` and ``train.compile`` apply here exactly as in training.

Conventions (reported in the output under ``conventions``):
- throughput excludes data loading: a pool of real batches is read first and cycled, so examples/s is
  the model step's rate; the loader's own rate is reported separately (``loader_examples_per_s``);
- examples/s is the median over ``windows`` timed windows of ``steps`` steps each, after ``warmup`` steps;
- model FLOPs per example = 3 x the model's analytic forward FLOPs (backward costs two forwards,
  embedding lookups count zero), **at each example's real history length** in the benchmark's batches
  (``executed_fwd_flops_per_example``; headline ``mfu``), and at full ``max_len`` beside it
  (``fwd_flops_per_example``, ``mfu_full``): histories are jagged, and counting them at max_len
  over-states the work. The FlopCounterMode forward FLOPs on one real batch are reported too
  (``measured_fwd_flops_per_example``, ``mfu_measured_flops``), and the FLOPs the model runs padding
  included (``padded_fwd_flops_per_example``, ``mfu_padded``, ``mfu_cpu_padded``: GEM's sequence path at
  each batch's, or each length bucket's, padded width): the headline never counts padding as work;
- the peak is the matmul peak of the precision the step runs in (bf16 under ``train.precision = "bf16"``),
  measured in the same process; ``peak_flops_fp32`` is measured beside it under bf16, for reference;
- on a shared CPU, wall-clock rates include time slices lost to other processes; ``mfu_cpu`` divides
  examples per CPU-second of the process by the matmul peak in CPU time, so that loss cancels out;
- time to first step runs from the start of the Trainer's construction (process group, model build,
  sharding plan, optimizers) to the end of the first optimizer step, including reading the first batch.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any

from opengem.bench.machine import PeakMemory, load_average, matmul_peak, pool_peaks, sync
from opengem.errors import TrainError, UsageError
from opengem.model.flops import (
    executed_flops_per_example,
    measured_flops,
    model_flops,
    padded_flops_per_example,
)
from opengem.train.config import RunConfig
from opengem.train.data import prepare_data
from opengem.train.env import resolve_device
from opengem.train.trainer import Trainer

CONVENTIONS = {
    "flops_per_example": "3 x analytic forward FLOPs (fwd + bwd), lookups = 0, at each example's real "
                         "history length (mfu); flops_per_example_full: at max_len (mfu_full)",
    "padded_flops_per_example": "3 x analytic forward FLOPs as run, padding included: the sequence path "
                                "at each batch's or bucket's padded width (mfu_padded, mfu_cpu_padded)",
    "examples_per_s": "median of timed windows after warm-up; batches pre-read and cycled (no data loading)",
    "peak_flops": "best timed block of n^3 matmuls (7 blocks before, 3 after each window, 7 after; each "
                  "after a 0.25 s warm-up, blocks of >= 10 ms) in the same process and threads, in the run's "
                  "precision (fp32 or bf16; 1024^3 on CPU, 4096^3 on GPU); peak_flops_median: median block",
    "mfu_cpu": "examples per CPU-second of this process (median window) x flops_per_example / median "
               "matmul block in CPU time: time slices lost to other processes cancel out (shared machines)",
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
    data_path = prepare_data(cfg.data, run_dir, data_dir, replace=True)  # the benchmarks' scratch data
    mem = PeakMemory(resolve_device(cfg.train.device))
    mem.start()
    t0 = time.perf_counter()
    # no run folder: nothing is written, so several models can be benchmarked over the same data
    with Trainer(cfg, None, data_path) as trainer:
        device = trainer.device
        loader = iter(trainer.train_loader())
        try:
            first = next(loader).to_device(device)
        except StopIteration:
            raise TrainError(f"{data_path}: partitions {cfg.data.train!r} gave no full batch of "
                             f"{cfg.data.batch_size} rows (lower data.batch_size)") from None
        loss0 = trainer.train_step(first)
        sync(device)
        ttfs = time.perf_counter() - t0
        precision = cfg.train.precision
        probes = [matmul_peak(device, peak_n, precision=precision)]

        batches = [first]
        t_load = time.perf_counter()
        for b in loader:
            batches.append(b.to_device(device))
            if len(batches) >= pool:
                break
        load_s = time.perf_counter() - t_load
        loader_rate = (len(batches) - 1) * cfg.data.batch_size / load_s if len(batches) > 1 else None

        for i in range(warmup):
            trainer.train_step(batches[i % len(batches)])
        sync(device)
        rates, cpu_rates, k = [], [], warmup
        for _ in range(windows):
            tw, cw = time.perf_counter(), time.process_time()
            for _ in range(steps):
                trainer.train_step(batches[k % len(batches)])
                k += 1
            sync(device)
            rates.append(steps * cfg.data.batch_size / (time.perf_counter() - tw))
            cpu_rates.append(steps * cfg.data.batch_size / max(time.process_time() - cw, 1e-9))
            # sample the peak between windows too: on a shared machine the quiet moments are brief
            probes.append(matmul_peak(device, peak_n, repeats=3, precision=precision))
        memory = mem.stop()
        probes.append(matmul_peak(device, peak_n, precision=precision))
        peak = {**probes[0], **pool_peaks(probes)}
        fp32_peak = (pool_peaks([matmul_peak(device, peak_n)]) if precision != "fp32" else peak)["peak_flops"]
        if not math.isfinite(trainer.last_loss):
            raise TrainError(f"bench: loss became {trainer.last_loss} (lower train.lr)")
        plain, model = trainer.parallel.plain, trainer.model
        fwd = model_flops(plain)
        executed_fwd = executed_flops_per_example(plain, batches)
        padded_fwd = padded_flops_per_example(plain, batches)
        measured_fwd = measured_flops(model, batches[0])
        model.train()
        dense_list = trainer.optimizers.dense
        ds = trainer.ds

    eps = statistics.median(rates)
    eps_cpu = statistics.median(cpu_rates)
    fpe = 3 * executed_fwd
    achieved = eps * fpe
    return {
        "model": cfg.model.name,
        "precision": precision,
        "examples_per_s": eps,
        "flops_per_example": fpe,
        "flops_per_example_full": 3 * fwd,
        "achieved_flops": achieved,
        "peak_flops": peak["peak_flops"],
        "peak_flops_fp32": fp32_peak,
        "peak_flops_cpu": peak["peak_flops_cpu"],
        "examples_per_cpu_s": eps_cpu,
        "mfu_cpu": eps_cpu * fpe / peak["peak_flops_cpu"],
        "mfu": achieved / peak["peak_flops"],
        "mfu_full": eps * 3 * fwd / peak["peak_flops"],
        "mfu_padded": eps * 3 * padded_fwd / peak["peak_flops"],
        "mfu_cpu_padded": eps_cpu * 3 * padded_fwd / peak["peak_flops_cpu"],
        "peak_mem_mb": memory["peak_mem_mb"],
        "time_to_first_step_s": ttfs,
        "fwd_flops_per_example": fwd,
        "executed_fwd_flops_per_example": executed_fwd,
        "padded_fwd_flops_per_example": padded_fwd,
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
        "peak_flops_median": peak["peak_flops_median"], "peak_blocks": peak["peak_blocks"],
        "peak_inner": peak["peak_inner"], "peak_n": peak["peak_n"],
        "peak_dtype": peak["peak_dtype"], "peak_kernel": peak["peak_kernel"],
        "peak_mem_abs_mb": memory["peak_mem_abs_mb"], "peak_mem_method": memory["peak_mem_method"],
        "load_average": load_average(), "data": str(data_path), "conventions": CONVENTIONS,
    }
