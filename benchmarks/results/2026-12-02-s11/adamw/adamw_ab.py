"""Fused vs default (for-loop) dense AdamW in the training step, paired: the same Trainer switches the
param groups' ``fused`` flag between interleaved windows; main-thread CPU ms per step (whole step and the
optimizer step alone).

    .venv/bin/python benchmarks/results/2026-12-02-s11/adamw/adamw_ab.py --out D train.threads=1
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # benchmarks/, for step_pool

from step_pool import StepPool  # noqa: E402

from opengem.train.config import load_run_config  # noqa: E402
from opengem.train.data import prepare_data  # noqa: E402
from opengem.train.trainer import Trainer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/small-d32.toml")
    ap.add_argument("--models", default="gem,dlrm,dcnv2")
    ap.add_argument("--out", default="runs/bench/adamw_ab")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--windows", type=int, default=6)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    print(f"{'model':8s}{'default ms/step':>16s}{'fused ms/step':>15s}{'speed-up':>10s}"
          f"{'opt step default':>18s}{'opt step fused':>16s}")
    for name in args.models.split(","):
        cfg = load_run_config(args.config, [*args.overrides, f"model.name={name}"])
        with Trainer(cfg, None, prepare_data(cfg.data, args.out, None)) as trainer:
            pool = StepPool(trainer, 8)
            opt = trainer.optimizers.dense_opt
            step_ms: dict[bool, list[float]] = {True: [], False: []}
            opt_ms: dict[bool, list[float]] = {True: [], False: []}
            real_step = opt.step

            def timed_step(*a, _fused=None, _step=real_step, _ms=opt_ms, **k):  # noqa: ANN001, ANN202
                t = time.thread_time()
                out = _step(*a, **k)
                _ms[_fused].append((time.thread_time() - t) * 1e3)
                return out

            for w in range(args.windows + 1):
                for fused in ((True, False) if w % 2 == 0 else (False, True)):
                    for g in opt.param_groups:
                        g["fused"] = fused
                    opt.step = lambda *a, _f=fused, _t=timed_step, **k: _t(*a, _fused=_f, **k)
                    ms = pool.cpu_s_per_step(args.steps) * 1e3
                    if w:  # window 0: warm-up
                        step_ms[fused].append(ms)
            d, f = statistics.median(step_ms[False]), statistics.median(step_ms[True])
            print(f"{name:8s}{d:16.1f}{f:15.1f}{d / f:9.2f}x{statistics.median(opt_ms[False]):18.2f}"
                  f"{statistics.median(opt_ms[True]):16.2f}")


if __name__ == "__main__":
    main()
