"""One training + evaluation run for the quality benchmarks, in its own process, result as one JSON file.

    .venv/bin/python benchmarks/quality_harness.py --config RECIPE --data DIR --out RESULT.json \
        [--train SPEC] [--valid SPEC] [--test SPEC] [--epochs N] [key=value ...]

Why not ``opengem train``: the benchmarks need per-epoch evaluation on a validation split and the test
metrics *of the best validation epoch* (early stopping, as BARS reports frappe) and a peak-memory figure
per model (one process per run). It is a thin user of the one :class:`~opengem.train.trainer.Trainer`
(built without a run folder, so nothing is written): the same model build and parallelization, the same
``train_step`` (precision, FP8 saved activations, task-weighted masked BCE, clipping, AdamW + warm-up, the
fused row-wise Adagrad on the tables), the same loaders (shuffled row groups and ``data.shuffle_window``
per epoch) and the same ``evaluate``; only the epoch loop and the choice of the best epoch are its own.

Early stopping: after every epoch the model is scored on ``--valid`` (mean AUC over surface x task
keys, ties broken by lower loss; ``--select ne``: mean NE) and on ``--test``; the reported test
metrics are those of the epoch with the best validation score, which equals restoring that epoch's
checkpoint. Training stops after ``--patience`` epochs without improvement.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np


def evaluate(trainer: Any, spec: str) -> dict[str, Any]:
    res = trainer.evaluate(spec)

    def num(x: Any) -> float:  # None where a surface x task has one label value only
        return float("nan") if x is None else float(x)

    metrics = {
        k: {"ne": num(v["ne"]), "auc": num(v["auc"]), "calibration": num(v.get("calibration"))}
        for k, v in res["metrics"].items()
    }
    return {"loss": res["loss"], "metrics": metrics}


def _score(res: dict[str, Any], select: str = "auc") -> tuple[float, float]:
    """Higher is better. ``auc``: mean AUC over surface x task keys (BARS's choice), ties by lower loss;
    ``ne``: minus the mean NE of the same keys (keeps calibrated epochs: AUC can keep rising while the
    predictions grow overconfident and NE gets worse)."""
    keys = [k for k in res["metrics"] if not k.startswith("all/")] or list(res["metrics"])
    vals = [res["metrics"][k][select] for k in keys if np.isfinite(res["metrics"][k][select])]
    if select == "ne":
        return (-float(np.mean(vals)) if vals else -np.inf, -res["loss"])
    return (float(np.mean(vals)) if vals else -1.0, -res["loss"])


def run(args: argparse.Namespace) -> dict[str, Any]:
    from opengem.train.config import load_run_config
    from opengem.train.trainer import Trainer

    cfg = load_run_config(args.config, args.overrides)
    cfg.train.threads = args.threads
    cfg.train.progress = False
    cfg.data.train = args.train
    t = cfg.train
    with Trainer(cfg, None, args.data) as trainer:
        flops = int(trainer.parallel.plain.flops_per_example())
        epochs = args.epochs or t.epochs
        history, best, best_key, bad = [], None, None, 0
        train_s, losses = 0.0, []
        for epoch in range(epochs):
            trainer.epoch = epoch
            t0 = time.perf_counter()
            for batch in trainer.train_loader():
                losses.append(trainer.train_step(batch))
                if t.steps and trainer.step >= t.steps:
                    break
            train_s += time.perf_counter() - t0
            rec: dict[str, Any] = {
                "epoch": epoch + 1,
                "step": trainer.step,
                "train_loss_last100": float(np.mean(losses[-100:])),
            }
            if args.valid:
                rec["valid"] = evaluate(trainer, args.valid)
            rec["test"] = evaluate(trainer, args.test)
            history.append(rec)
            key = _score(rec["valid"] if args.valid else rec["test"], args.select)
            print(
                f"[{args.out}] epoch {epoch + 1}: step {trainer.step} train loss "
                f"{rec['train_loss_last100']:.4f} "
                + (f"valid AUC {key[0]:.4f} " if args.valid else "")
                + "test all: "
                + ", ".join(
                    f"{k} NE {v['ne']:.4f} AUC {v['auc']:.4f}"
                    for k, v in rec["test"]["metrics"].items()
                    if k.startswith("all/")
                ),
                flush=True,
            )
            if best_key is None or key > best_key:
                best, best_key, bad = rec, key, 0
            else:
                bad += 1
                if args.valid and bad >= args.patience:
                    break
            if t.steps and trainer.step >= t.steps:
                break
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return {
            "config": args.config,
            "overrides": args.overrides,
            "data": str(args.data),
            "model": cfg.model.name,
            "seed": t.seed,
            "lr": t.lr,
            "sparse_lr": t.sparse_lr,
            "flops_per_example": flops,
            "steps": trainer.step,
            "examples": trainer.examples,
            "train_seconds": train_s,
            "examples_per_s": trainer.examples / max(train_s, 1e-9),
            "peak_rss_mb": rss_mb,
            "loadavg": os.getloadavg(),
            "best_epoch": best["epoch"],
            "test": best["test"],
            "valid": best.get("valid"),
            "history": history,
        }


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--train", default="@all_but_last")
    p.add_argument("--valid", default="")
    p.add_argument("--test", default="@last")
    p.add_argument("--epochs", type=int, default=0, help="0 = train.epochs of the recipe")
    p.add_argument("--patience", type=int, default=2)
    p.add_argument("--select", choices=["auc", "ne"], default="auc",
                   help="the validation metric that picks the reported epoch (and early stopping)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    res = run(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
