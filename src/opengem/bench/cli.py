"""``opengem bench train``: the training-step benchmark of one recipe, for one or several models.

    opengem bench train --config configs/small.toml [section.key=value ...] [--models gem,dlrm,dcnv2]
                        [--steps 20 --warmup 5 --windows 5] [--json]

Several models run in one process, one after another, each against a matmul peak measured just before
it, and the table gives each one's throughput as a ratio to the first: on a shared machine ratios within
one run mean more than absolute numbers. With ``--json``: one model -> one JSON object (keys
examples_per_s, flops_per_example, achieved_flops, peak_flops, mfu, peak_mem_mb, time_to_first_step_s,
and more); several -> ``{"runs": [...], "load_average": [...]}``.

When the data is the embedded simulator, only enough rows for the benchmark's batches are simulated
(``data.sim.rows`` is lowered unless given on the command line): a benchmark reads a few batches, and
simulating base.toml's 10 M rows would take longer than the benchmark.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from opengem.bench.serve_bench import add_serve_arguments, run_serve
from opengem.errors import OpengemError, UsageError


class BenchError(OpengemError, RuntimeError):
    """A model benchmarked in its own process (``--models a,b``) stopped on a user error; its exit code."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("train", help="training step: examples/s, FLOPs, MFU, peak memory, time to first step")
    t.add_argument("--config", required=True, help="run recipe (configs/tiny.toml, small, base, large)")
    t.add_argument("--models", default="", help="comma-separated model names to run in turn (default: the "
                   "recipe's model.name)")
    t.add_argument("--data", default=None, help="dataset folder (default: the recipe's data / simulator)")
    t.add_argument("--out", default=None, help="folder for simulated data (default: runs/bench/<recipe>)")
    t.add_argument("--steps", type=int, default=20, help="steps per timed window")
    t.add_argument("--warmup", type=int, default=5, help="untimed steps before the windows")
    t.add_argument("--windows", type=int, default=5, help="timed windows (examples/s is their median)")
    t.add_argument("--pool", type=int, default=16, help="real batches read first and cycled")
    t.add_argument("--peak-n", type=int, default=None, help="matmul size for the peak (CPU 1024, GPU 4096)")
    t.add_argument("--json", action="store_true", help="print JSON instead of the table")
    t.add_argument("overrides", nargs="*", metavar="section.key=value")
    add_serve_arguments(sub)


def bench_rows_needed(cfg: Any, pool: int) -> int:
    """Simulated rows that give ``pool`` full training batches (the last day is held out) with slack."""
    days = int(cfg.data.sim.get("days", 7))
    frac = (days - 1) / days if days > 1 else 1.0
    return int(math.ceil(1.5 * (pool + 1) * cfg.data.batch_size / frac))


def format_table(results: list[dict[str, Any]]) -> str:
    r0 = results[0]
    head = (f"device {r0['device']}, threads {r0['threads']}, batch {r0['batch_size']}, "
            f"{r0['windows']} windows x {r0['steps']} steps after {r0['warmup']} warm-up, "
            f"load average {r0['load_average']}")
    cols = (f"{'model':<8}{'prec':>5}{'fwd MFLOP/ex':>13}{'examples/s':>12}{'x first':>8}{'GFLOP/s':>9}"
            f"{'peak GFLOP/s':>13}{'MFU':>8}{'MFU full':>9}{'MFU cpu':>8}{'peak MB':>9}{'1st step s':>11}"
            f"{'loader x':>9}")
    lines = [head, cols, "-" * len(cols)]
    for r in results:
        loader = r.get("loader_examples_per_s")
        fwd = r["executed_fwd_flops_per_example"]
        lines.append(
            f"{r['model']:<8}{r.get('precision', 'fp32'):>5}{fwd / 1e6:>13.3f}"
            f"{r['examples_per_s']:>12,.0f}{r['examples_per_s'] / r0['examples_per_s']:>8.2f}"
            f"{r['achieved_flops'] / 1e9:>9.2f}{r['peak_flops'] / 1e9:>13.1f}{r['mfu']:>8.2%}"
            f"{r['mfu_full']:>9.2%}{r.get('mfu_cpu', float('nan')):>8.2%}{r['peak_mem_mb']:>9.1f}"
            f"{r['time_to_first_step_s']:>11.2f}"
            f"{loader / r['examples_per_s'] if loader else float('nan'):>9.1f}")
    lines.append("FLOPs/example = 3 x analytic forward (fwd+bwd) at each example's real history length; "
                 "'MFU full' counts every history at max_len. Peak: best matmul in the run's precision, same "
                 f"process ({r0.get('peak_kernel') or 'aten'}; fp32 on CPU: the faster of MKL and oneDNN).")
    lines.append("MFU cpu = examples per CPU-second of this process x FLOPs/example / CPU-time peak (time "
                 "slices lost to other processes cancel out on a shared machine)")
    lines.append("loader x = loader examples/s (reading + moving batches, same run) / training examples/s")
    lines.append(f"peak memory: {r0['peak_mem_method']}")
    return "\n".join(lines)


def check_args(args: argparse.Namespace) -> None:
    """Refuse counts that cannot make a benchmark, naming the flag, before any config or data is read."""
    for flag, value, least in (("--steps", args.steps, 1), ("--windows", args.windows, 1),
                               ("--warmup", args.warmup, 0), ("--pool", args.pool, 1)):
        if value < least:
            raise UsageError(f"{flag}: must be >= {least} (got {value})")
    if args.peak_n is not None and args.peak_n < 1:
        raise UsageError(f"--peak-n: must be >= 1 (got {args.peak_n})")


def run(args: argparse.Namespace) -> int:
    from opengem.train.config import load_run_config

    if args.mode == "serve":
        return run_serve(args)
    check_args(args)
    return run_train(args, load_run_config(args.config, args.overrides))


def run_train(args: argparse.Namespace, cfg: Any) -> int:
    models = [m for m in args.models.split(",") if m] or [cfg.model.name]
    failed: list[dict[str, str]] = []
    if len(models) == 1:
        results = [bench_one(args, models[0])]
    else:
        results = []
        for m in models:
            try:
                results.append(bench_subprocess(args, m))
            except ModelCrashed as e:
                # one model's crash (a kernel or compile failure on some device) must not cost the others'
                # numbers: its trace goes to stderr now, the rest still run, and the exit status says so
                print(f"opengem bench: {e}", file=sys.stderr)
                failed.append({"model": m, "error": e.last_line})
    if args.json:
        from opengem.bench.machine import load_average

        obj = (results[0] if len(results) == 1 and not failed else
               {"runs": results, "failed": failed, "load_average": load_average()})
        print(json.dumps(obj, indent=2))
    elif results:
        print(format_table(results))
    for f in failed:
        print(f"opengem bench: error: model {f['model']} failed: {f['error']}", file=sys.stderr)
    return 1 if failed else 0


class ModelCrashed(RuntimeError):
    """A model's bench process died with a traceback (not a user's mistake)."""

    def __init__(self, model: str, returncode: int, stderr: str) -> None:
        super().__init__(f"bench {model} failed (exit {returncode}):\n{stderr[-3000:]}")
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        self.last_line = lines[-1] if lines else f"exit {returncode}"


def bench_one(args: argparse.Namespace, model: str) -> dict[str, Any]:
    import copy

    from opengem.bench.train_bench import bench_train
    from opengem.train.config import load_run_config

    c = load_run_config(args.config, [*args.overrides, f"model.name={model}", "train.progress=false"])
    out = Path(args.out or Path("runs/bench") / Path(args.config).stem)
    if not (args.data or c.data.path) and not any(o.startswith("data.sim.rows=") for o in args.overrides):
        c.data.sim = {**copy.deepcopy(c.data.sim), "rows": bench_rows_needed(c, args.pool)}
    return bench_train(c, out, args.data, steps=args.steps, warmup=args.warmup, windows=args.windows,
                       pool=args.pool, peak_n=args.peak_n)


def bench_subprocess(args: argparse.Namespace, model: str) -> dict[str, Any]:
    """One model per fresh process: peak RSS and time to first step are then that model's alone."""
    import subprocess

    cmd = [sys.executable, "-m", "opengem.cli", "bench", "train", "--config", args.config, "--json",
           "--models", model, "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--windows", str(args.windows), "--pool", str(args.pool)]
    for flag, v in (("--data", args.data), ("--out", args.out), ("--peak-n", args.peak_n)):
        if v is not None:
            cmd += [flag, str(v)]
    proc = subprocess.run([*cmd, *args.overrides], capture_output=True, text=True)
    if proc.returncode != 0:
        # the child's own one-line error (a user's mistake) is ours; anything else is a crash, with its trace
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("opengem bench: error: ")]
        if errors and "Traceback (most recent call last)" not in proc.stderr:
            raise BenchError(f"model {model}: {errors[-1].removeprefix('opengem bench: error: ')}",
                             proc.returncode)
        raise ModelCrashed(model, proc.returncode, proc.stderr)
    return json.loads(proc.stdout)
