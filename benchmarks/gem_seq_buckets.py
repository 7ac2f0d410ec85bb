"""GEM's training step with the sequence path on K length buckets (``model.gem.seq_buckets``) vs K = 1.

``ab``: one Trainer (the recipe's model, DMP, fused sparse optimizer, AdamW: the step ``opengem bench
train`` times), one pool of real batches cycled; the same weights run each K in interleaved windows (the
order rotates every round), so machine load hits every K alike. Time is the main thread's CPU time
(``time.thread_time``): run with ``OMP_NUM_THREADS=1`` and ``train.threads=1`` so all of the step's work is
on that thread, and other processes (or being paused) do not count. Reports per K the median CPU ms per
step and per example, the speed-up over K = 1, and the padded forward FLOPs per example of the pool.

``quality``: ``--steps`` training steps from the same seed with K = 1 and with ``--k``, fresh Trainer
each: bucketing is exact, so the two loss curves must agree to float rounding.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/gem_seq_buckets.py ab --ks 1,2,4,8 \\
        --data DATA train.threads=1
    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/gem_seq_buckets.py quality --k 4 --steps 300 \\
        --data DATA train.threads=1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from step_pool import StepPool

from opengem.model.flops import executed_flops_per_example, measured_flops, padded_flops_per_example
from opengem.train.config import load_run_config
from opengem.train.data import prepare_data
from opengem.train.trainer import Trainer


def ab(args: argparse.Namespace) -> dict:
    cfg = load_run_config(args.config, args.overrides)
    data = prepare_data(cfg.data, args.out, args.data)
    ks = [int(k) for k in args.ks.split(",")]
    B = cfg.data.batch_size
    with Trainer(cfg, None, data) as trainer:
        pool = StepPool(trainer, args.pool)
        batches = pool.batches
        model = trainer.parallel.plain
        steps = pool.cpu_s_per_step

        flops, counted = {}, {}
        for k in ks:  # warm-up; the padded FLOPs each K runs on this pool, and what FlopCounterMode counts
            model.cfg.seq_buckets = k  # (the model's own kernels: the fused pyramid skips empty chunks)
            steps(2)
            flops[k] = padded_flops_per_example(model, batches)
            counted[k] = statistics.fmean(measured_flops(trainer.model, b) for b in batches[:4])
            trainer.model.train()
        times: dict[int, list[float]] = {k: [] for k in ks}
        for r in range(args.rounds):
            order = ks[r % len(ks):] + ks[: r % len(ks)]
            for k in order:
                model.cfg.seq_buckets = k
                times[k].append(steps(args.steps))
        real = executed_flops_per_example(model, batches)
        model.cfg.seq_buckets = 1
    base = statistics.median(times[ks[0]])
    rows = []
    for k in ks:
        med = statistics.median(times[k])
        rows.append({"k": k, "cpu_ms_per_step": med * 1e3, "cpu_us_per_example": med / B * 1e6,
                     "speedup_vs_first": base / med, "padded_fwd_flops_per_example": flops[k],
                     "measured_fwd_flops_per_example_4_batches": counted[k],
                     "windows_cpu_ms_per_step": [t * 1e3 for t in times[k]]})
    return {"batch_size": B, "threads": torch.get_num_threads(), "pool": len(batches), "rounds": args.rounds,
            "steps_per_window": args.steps, "real_fwd_flops_per_example": real, "rows": rows,
            "load_average_end": os.getloadavg()}


def quality(args: argparse.Namespace) -> dict:
    """Loss curves of K = 1 (the baseline) and of each arm: ``--k`` bucket counts, and ``--arm`` override
    sets (e.g. ``model.gem.kernel=pytorch``: the fused/reference twins differ by fp32 rounding only, so
    their curves show what rounding alone does over training)."""
    arms = {f"seq_buckets={k}": [f"model.gem.seq_buckets={k}"] for k in args.k.split(",") if k}
    arms.update({a: a.split(";") for a in args.arm})
    curves = {}
    for name, extra in {"baseline": [], **arms}.items():
        cfg = load_run_config(args.config, [*args.overrides, *extra])
        data = prepare_data(cfg.data, args.out, args.data)
        losses = []
        t = time.thread_time()
        with Trainer(cfg, None, data) as trainer:
            for batch in trainer.train_loader():
                losses.append(float(trainer.train_step(batch.to(trainer.device))))
                if len(losses) >= args.steps:
                    break
        curves[name] = {"losses": losses, "cpu_s": time.thread_time() - t}
    ref = curves["baseline"]["losses"]
    compared = {}
    for name in arms:
        diffs = [abs(x - y) for x, y in zip(ref, curves[name]["losses"])]
        compared[name] = {"steps": len(diffs), "max_abs_loss_diff": max(diffs),
                          "max_abs_loss_diff_first_100": max(diffs[:100]),
                          "mean_abs_loss_diff_last_100": statistics.fmean(diffs[-100:]),
                          "steps_bitwise_equal": sum(d == 0 for d in diffs)}
    return {"compared_with_baseline": compared,
            "loss_mean_last_50": {k: sum(c["losses"][-50:]) / 50 for k, c in curves.items()},
            "cpu_s": {k: c["cpu_s"] for k, c in curves.items()},
            "curves": {k: c["losses"] for k, c in curves.items()}, "load_average_end": os.getloadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["ab", "quality"])
    ap.add_argument("--config", default="configs/small.toml")
    ap.add_argument("--out", default="runs/bench/gem_seq_buckets", help="folder for simulated data")
    ap.add_argument("--data", default=None, help="dataset folder (default: the recipe's data / simulator)")
    ap.add_argument("--ks", default="1,2,4,8", help="ab: bucket counts, the first is the baseline")
    ap.add_argument("--pool", type=int, default=16, help="ab: real batches read first and cycled")
    ap.add_argument("--steps", type=int, default=4, help="ab: steps per window; quality: training steps")
    ap.add_argument("--rounds", type=int, default=8, help="ab: windows per K (interleaved)")
    ap.add_argument("--k", default="4", help="quality: bucket counts compared with K = 1 (comma-separated)")
    ap.add_argument("--arm", action="append", default=[], help="quality: another arm, overrides joined by ;")
    ap.add_argument("--json", default=None, help="also write the result here")
    ap.add_argument("overrides", nargs="*", help="section.key=value")
    args = ap.parse_intermixed_args()
    print(f"load average at start {os.getloadavg()}", flush=True)
    result = ab(args) if args.mode == "ab" else quality(args)
    text = json.dumps(result, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    summary = {k: v for k, v in result.items() if k != "curves"}
    if "rows" in summary:
        summary["rows"] = [{k: v for k, v in r.items() if k != "windows_cpu_ms_per_step"}
                           for r in summary["rows"]]
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
