"""One training + evaluation run for the quality benchmarks, in its own process, result as one JSON file.

    .venv/bin/python benchmarks/quality_harness.py --config RECIPE --data DIR --out RESULT.json \
        [--train SPEC] [--valid SPEC] [--test SPEC] [--epochs N] [key=value ...]

Why a separate loop rather than ``opengem train``: the benchmarks need per-epoch evaluation on a
validation split and the test metrics *of the best validation epoch* (early stopping, as BARS reports
frappe), a peak-memory figure per model (one process per run), and results that do not move when the
trainer grows distributed features. It still trains exactly as the trainer does: the same
``build_model``, the same step (``opengem.train.step``: precision, FP8 saved activations, ``masked_bce``
with the schema's task weights, clipping, optimizer and schedule), TorchRec DistributedModelParallel with
the fused row-wise Adagrad on the tables (``opengem.train.optim``), AdamW + linear warm-up on the dense
part, and the same ``ParquetLoader`` with shuffled row groups (and ``data.shuffle_window``) per epoch.

Early stopping: after every epoch the model is scored on ``--valid`` (mean AUC over surface x task
keys; ties broken by lower loss) and on ``--test``; the reported test metrics are those of the epoch
with the best validation AUC, which equals restoring that epoch's checkpoint. Training stops after
``--patience`` epochs without improvement.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist


def _dmp(model: torch.nn.Module, pg: Any) -> torch.nn.Module:
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.sharding_plan import get_default_sharders
    from torchrec.distributed.types import ShardingEnv
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from opengem.train.optim import embedding_modules

    tables = [
        t.name
        for m in embedding_modules(model)
        for t in (
            m.embedding_bag_configs() if isinstance(m, EmbeddingBagCollection) else m.embedding_configs()
        )
    ]
    if not tables:
        return model
    constraints = {t: ParameterConstraints(sharding_types=["table_wise", "row_wise"]) for t in tables}
    for name in ("torchrec.distributed.planner", "torch.fx._symbolic_trace"):
        logging.getLogger(name).setLevel(logging.ERROR)
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=1, compute_device="cpu"), constraints=constraints
    )
    sharders = get_default_sharders()
    plan = planner.collective_plan(model, sharders, pg)
    return DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(pg),
        device=torch.device("cpu"),
        plan=plan,
        sharders=sharders,
        init_data_parallel=False,
    )


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: Any, schema: Any) -> dict[str, Any]:
    from opengem.metrics import MetricAccumulator
    from opengem.model.heads import masked_bce

    model.eval()
    acc = MetricAccumulator(schema.surfaces, schema.task_names)
    w = torch.tensor([t.weight for t in schema.tasks])
    loss, n = 0.0, 0
    for batch in loader:
        logits = model(batch).logits
        loss += float(masked_bce(logits, batch.labels, batch.label_mask, w))
        n += 1
        acc.update(torch.sigmoid(logits.float()), batch.labels, batch.label_mask, batch.surface)

    def num(x: Any) -> float:  # None where a surface x task has one label value only
        return float("nan") if x is None else float(x)

    metrics = {
        k: {"ne": num(v["ne"]), "auc": num(v["auc"]), "calibration": num(v.get("calibration"))}
        for k, v in acc.compute().items()
    }
    return {"loss": loss / max(n, 1), "metrics": metrics}


def _score(res: dict[str, Any]) -> tuple[float, float]:
    keys = [k for k in res["metrics"] if not k.startswith("all/")] or list(res["metrics"])
    aucs = [res["metrics"][k]["auc"] for k in keys if np.isfinite(res["metrics"][k]["auc"])]
    return (float(np.mean(aucs)) if aucs else -1.0, -res["loss"])


def run(args: argparse.Namespace) -> dict[str, Any]:
    from opengem.data.dataset import Dataset
    from opengem.data.loader import ParquetLoader
    from opengem.model.registry import build_model
    from opengem.train.config import load_run_config
    from opengem.train.optim import (
        apply_sparse_optimizer,
        build_optimizers,
    )
    from opengem.train.step import forward_loss, optimizer_step

    cfg = load_run_config(args.config, args.overrides)
    t = cfg.train
    torch.set_num_threads(args.threads)
    ds = Dataset(args.data)
    schema = ds.schema
    bs, ebs = cfg.data.batch_size, cfg.data.eval_batch_size or cfg.data.batch_size

    def loader(spec: str, train: bool, seed: int = 0) -> ParquetLoader:
        return ParquetLoader(
            ds.files(spec),
            schema,
            bs if train else ebs,
            drop_last=train,
            shuffle_units=train and cfg.data.shuffle,
            shuffle_window=cfg.data.shuffle_window if train else 0,
            seed=seed,
        )

    tmp = tempfile.mkdtemp(prefix="opengem-mq-")
    dist.init_process_group("gloo", store=dist.FileStore(f"{tmp}/store", 1), rank=0, world_size=1)
    try:
        torch.manual_seed(t.seed)
        plain = build_model(schema, cfg.model)
        flops = int(plain.flops_per_example())
        apply_sparse_optimizer(plain, t)
        model = _dmp(plain, dist.group.WORLD)
        dense_list, opt, sched, _ = build_optimizers(model, t)
        weights = torch.tensor([x.weight for x in schema.tasks])
        device = torch.device("cpu")
        epochs = args.epochs or t.epochs
        history, best, best_key, bad = [], None, None, 0
        step, examples, train_s, losses = 0, 0, 0.0, []
        for epoch in range(epochs):
            model.train()
            t0 = time.perf_counter()
            for batch in loader(args.train, True, seed=t.seed + epoch):
                loss = forward_loss(model, batch, weights, t, device)
                if not torch.isfinite(loss):
                    raise RuntimeError(f"epoch {epoch} step {step}: loss {float(loss)}")
                optimizer_step(loss, opt, sched, dense_list, t.grad_clip)
                step += 1
                examples += batch.batch_size
                losses.append(float(loss.detach()))
                if t.steps and step >= t.steps:
                    break
            train_s += time.perf_counter() - t0
            rec: dict[str, Any] = {
                "epoch": epoch + 1,
                "step": step,
                "train_loss_last100": float(np.mean(losses[-100:])),
            }
            if args.valid:
                rec["valid"] = evaluate(model, loader(args.valid, False), schema)
            rec["test"] = evaluate(model, loader(args.test, False), schema)
            history.append(rec)
            key = _score(rec["valid"] if args.valid else rec["test"])
            print(
                f"[{args.out}] epoch {epoch + 1}: step {step} train loss {rec['train_loss_last100']:.4f} "
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
            if t.steps and step >= t.steps:
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
            "steps": step,
            "examples": examples,
            "train_seconds": train_s,
            "examples_per_s": examples / max(train_s, 1e-9),
            "peak_rss_mb": rss_mb,
            "loadavg": os.getloadavg(),
            "best_epoch": best["epoch"],
            "test": best["test"],
            "valid": best.get("valid"),
            "history": history,
        }
    finally:
        dist.destroy_process_group()
        shutil.rmtree(tmp, ignore_errors=True)


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
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    res = run(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
