"""GEM's training step with the reference ops vs the fused twins, in one process, plus the step's profile.

One Trainer (the recipe's model, DMP, fused sparse optimizer, AdamW: the step ``opengem bench train``
times), one pool of real batches; the same weights run ``model.gem.kernel = "pytorch"`` and ``"fused"`` in
interleaved windows, so machine load hits both alike. Reports per kernel the median wall and process-CPU
milliseconds per step (CPU time is the steadier figure on a shared machine) and, with ``--profile N``, the
top-N ops of the fused step by self CPU time; with ``--modules D``, the forward's process-CPU milliseconds
per step in every block down to depth D (hooks around each block's forward; the backward is not split by
block, so the table also prints the whole step for scale).

    nice -n 10 .venv/bin/python benchmarks/gem_kernels.py --config configs/small.toml --profile 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from opengem.model.sequence import use_kernel
from opengem.train.config import load_run_config
from opengem.train.data import prepare_data
from opengem.train.trainer import Trainer

KERNELS = ("pytorch", "fused")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/small.toml")
    ap.add_argument("--out", default="runs/bench/gem_kernels", help="folder for simulated data")
    ap.add_argument("--data", default=None, help="dataset folder (default: the recipe's data / simulator)")
    ap.add_argument("--steps", type=int, default=8, help="steps per timed window")
    ap.add_argument("--windows", type=int, default=3, help="timed windows per kernel (interleaved)")
    ap.add_argument("--profile", type=int, default=0, help="print the top-N ops of the fused step")
    ap.add_argument("--modules", type=int, default=0, help="forward CPU time per block down to this depth")
    ap.add_argument("overrides", nargs="*", help="section.key=value")
    args = ap.parse_args()
    cfg = load_run_config(args.config, args.overrides)
    data = prepare_data(cfg.data, args.out, args.data)
    with Trainer(cfg, None, data) as trainer:
        loader = iter(trainer.train_loader())
        batches = [next(loader).to(trainer.device) for _ in range(8)]
        model = trainer.parallel.plain
        k = 0

        def steps(n: int) -> tuple[float, float]:
            nonlocal k
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(n):
                trainer.train_step(batches[k % len(batches)])
                k += 1
            return (time.perf_counter() - wall) / n * 1e3, (time.process_time() - cpu) / n * 1e3

        for kernel in KERNELS:  # warm-up
            use_kernel(model, kernel)
            steps(3)
        times: dict[str, list[tuple[float, float]]] = {kn: [] for kn in KERNELS}
        for _ in range(args.windows):
            for kernel in KERNELS:
                use_kernel(model, kernel)
                times[kernel].append(steps(args.steps))
        B = cfg.data.batch_size
        print(f"load average {os.getloadavg()}, batch {B}, threads {torch.get_num_threads()}")
        for kernel, ts in times.items():
            wall = statistics.median(t[0] for t in ts)
            cpu = statistics.median(t[1] for t in ts)
            print(f"{kernel:8s} wall {wall:7.1f} ms/step ({B / wall * 1e3:6.0f} ex/s)   "
                  f"cpu {cpu:7.1f} ms/step ({B / cpu * 1e3:6.0f} ex/s)")
        ref, fused = (statistics.median(t[1] for t in times[kn]) for kn in KERNELS)
        print(f"fused / reference speed-up (cpu time): {ref / fused:.2f}x")
        if args.profile:
            use_kernel(model, "fused")
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                steps(args.steps)
            events = prof.key_averages()
            print(events.table(sort_by="self_cpu_time_total", row_limit=args.profile,
                               max_name_column_width=60))
            n_ops = sum(e.count for e in events if e.key.startswith("aten::")) / args.steps
            print(f"aten ops per step: {n_ops:.0f}")
        if args.modules:
            use_kernel(model, "fused")
            forward_by_block(model, lambda: steps(args.steps), args.steps, args.modules)


def forward_by_block(model: torch.nn.Module, run, n_steps: int, depth: int) -> None:  # noqa: ANN001
    """Print each block's forward CPU ms per step (blocks nest: a parent's time includes its children's)."""
    spent: dict[str, float] = {}
    started: dict[str, float] = {}
    hooks = []
    for name, m in model.named_modules():
        if name and name.count(".") < depth:
            hooks.append(m.register_forward_pre_hook(
                lambda _m, _a, n=name: started.__setitem__(n, time.process_time())))
            hooks.append(m.register_forward_hook(
                lambda _m, _a, _o, n=name: spent.__setitem__(n, spent.get(n, 0.0) + time.process_time()
                                                              - started[n])))
    try:
        step_ms = run()[1]
    finally:
        for h in hooks:
            h.remove()
    print(f"whole step (forward, backward, optimizer): {step_ms:.1f} ms CPU")
    for name, _ in model.named_modules():
        ms = spent.get(name, 0.0) / n_steps * 1e3
        if ms >= 0.5:
            print(f"  {'  ' * name.count('.')}{name:<{56 - 2 * name.count('.')}} {ms:7.2f} ms forward")


if __name__ == "__main__":
    main()
