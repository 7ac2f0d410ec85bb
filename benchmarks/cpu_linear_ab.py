"""``train.cpu_linear``: the training step with PyTorch's BLAS vs oneDNN for the dense layers, paired.

One Trainer per model (the recipe's, DMP, fused sparse optimizer, AdamW: the step ``opengem bench train``
times), one pool of real batches; the same weights switch between the two kernels (``nn.Linear`` <->
``OneDNNLinear``, Wukong's ``linear_kernel``) in interleaved windows, so machine load hits both alike.
Reports the median main-thread CPU ms per step of each and their ratio, per model and precision.

    .venv/bin/python benchmarks/cpu_linear_ab.py --config configs/small-d32.toml --models gem,dlrm,dcnv2 \
        --precisions fp32,bf16 --out runs/bench/d32 train.threads=1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
from step_pool import StepPool
from torch import nn

from opengem.ops.kernel import Kernel
from opengem.train.config import load_run_config
from opengem.train.cpu_linear import OneDNNLinear
from opengem.train.data import prepare_data
from opengem.train.trainer import Trainer

KERNELS = ("pytorch", "onednn")


def set_kernel(model: nn.Module, kernel: str) -> None:
    """Switch every dense layer of ``model`` to ``kernel`` in place (the weights stay the same)."""
    for m in model.modules():
        if isinstance(m, nn.Linear):
            m.__class__ = OneDNNLinear if kernel == "onednn" else nn.Linear
        if hasattr(m, "linear_kernel"):
            m.linear_kernel = Kernel.ONEDNN if kernel == "onednn" else Kernel.PYTORCH


def measure(config: str, model_name: str, precision: str, out: str, data_dir: str | None, steps: int,
            windows: int, overrides: list[str]) -> dict[str, object]:
    cfg = load_run_config(config, [*overrides, f"model.name={model_name}", f"train.precision={precision}",
                                   "train.cpu_linear=onednn"])
    data = prepare_data(cfg.data, out, data_dir)
    with Trainer(cfg, None, data) as trainer:
        pool = StepPool(trainer, 8)
        model = trainer.parallel.plain

        def run(n: int) -> float:
            return pool.cpu_s_per_step(n) * 1e3

        for kernel in KERNELS:  # warm-up
            set_kernel(model, kernel)
            run(3)
        ms: dict[str, list[float]] = {kn: [] for kn in KERNELS}
        for w in range(windows):
            for kernel in (KERNELS if w % 2 == 0 else KERNELS[::-1]):
                set_kernel(model, kernel)
                ms[kernel].append(run(steps))
    med = {kn: statistics.median(v) for kn, v in ms.items()}
    return {"model": model_name, "precision": precision, "cpu_ms_per_step": med, "windows": ms,
            "speedup": med["pytorch"] / med["onednn"], "batch_size": cfg.data.batch_size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/small-d32.toml")
    ap.add_argument("--models", default="gem,dlrm,dcnv2")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--out", default="runs/bench/cpu_linear_ab", help="folder for simulated data")
    ap.add_argument("--data", default=None, help="dataset folder (default: the recipe's data / simulator)")
    ap.add_argument("--steps", type=int, default=8, help="steps per timed window")
    ap.add_argument("--windows", type=int, default=6, help="timed windows per kernel (interleaved)")
    ap.add_argument("--json", default="", help="also write the results here")
    ap.add_argument("overrides", nargs="*", help="section.key=value")
    args = ap.parse_args()
    load = os.getloadavg()
    rows = [measure(args.config, m, p, args.out, args.data, args.steps, args.windows, args.overrides)
            for p in args.precisions.split(",") for m in args.models.split(",")]
    print(f"load average {load} -> {os.getloadavg()}, threads {torch.get_num_threads()}")
    print(f"{'model':8s}{'prec':6s}{'BLAS ms/step':>14s}{'oneDNN ms/step':>16s}{'ex/s BLAS':>11s}"
          f"{'ex/s oneDNN':>13s}{'speed-up':>10s}")
    for r in rows:
        b, o, B = r["cpu_ms_per_step"]["pytorch"], r["cpu_ms_per_step"]["onednn"], r["batch_size"]
        print(f"{r['model']:8s}{r['precision']:6s}{b:14.1f}{o:16.1f}{B / b * 1e3:11,.0f}{B / o * 1e3:13,.0f}"
              f"{r['speedup']:9.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load_average": [load, os.getloadavg()], "rows": rows,
                       "command": " ".join(sys.argv)}, f, indent=1)


if __name__ == "__main__":
    main()
