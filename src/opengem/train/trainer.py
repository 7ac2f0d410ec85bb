"""One training run in one process: data -> sharded model -> fused sparse + dense optimizers -> logs.

The model always goes through TorchRec's DistributedModelParallel, even alone on a CPU, so the fused
sparse optimizer runs and the multi-process path (torchrun) differs only in the process group. When no
process group exists, a 1-process one is created on a FileStore (gloo on CPU, NCCL on CUDA) and
destroyed at the end, so one Python process can run several trainings (tests, the demo).

Outputs in RUN/: config.toml (resolved), metrics.jsonl (one JSON record per log/eval), tb/ (TensorBoard),
checkpoints/final (DCP), train_summary.json.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.types import ShardingEnv
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from opengem.config import save_config
from opengem.data.dataset import Dataset
from opengem.data.schema import FeatureSchema
from opengem.model.heads import masked_bce
from opengem.model.registry import build_model
from opengem.train import checkpoint as ckpt
from opengem.train.config import DataConfig, RunConfig
from opengem.train.optim import (
    apply_sparse_optimizer,
    build_dense_optimizer,
    build_scheduler,
    clip_dense_gradients,
    dense_parameters,
    embedding_modules,
)

SIM_MARKER = ".opengem_sim_config.json"


class TrainError(RuntimeError):
    pass


# --------------------------------------------------------------------------- environment
def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise TrainError("train.device = 'cuda' but no CUDA device is available (use 'auto' or 'cpu')")
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))  # an index: set_device and DMP need one


@contextlib.contextmanager
def cpu_threads(n: int) -> Iterator[None]:
    """Run with n intra-op threads (0 = unchanged) and restore: tiny models lose time to OpenMP sync."""
    old = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


@contextlib.contextmanager
def process_group(device: torch.device) -> Iterator[dist.ProcessGroup]:
    """The existing default group (torchrun), or a private 1-process one destroyed on exit."""
    if dist.is_initialized():
        yield dist.group.WORLD
        return
    tmp = tempfile.mkdtemp(prefix="opengem-pg-")
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.FileStore(f"{tmp}/store", 1), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()
        shutil.rmtree(tmp, ignore_errors=True)


def shard_model(model: nn.Module, device: torch.device, pg: dist.ProcessGroup) -> nn.Module:
    """Wrap in DMP with a planned sharding; tables restricted to table/row-wise.

    Data-parallel sharding fails for EmbeddingCollection on CPU (DESIGN §9) and would take the tables
    away from the fused sparse optimizer, so the planner may only choose table-wise or row-wise.
    """
    if device.type == "cuda":
        torch.cuda.set_device(device)
    tables = [t.name for m in embedding_modules(model) for t in _table_configs(m)]
    if not tables:
        return model.to(device)
    constraints = {t: ParameterConstraints(sharding_types=["table_wise", "row_wise"]) for t in tables}
    world = dist.get_world_size(pg)
    topology = Topology(world_size=world, compute_device=device.type,
                        local_world_size=min(world, max(1, torch.cuda.device_count()))
                        if device.type == "cuda" else world)
    for name in ("torchrec.distributed.planner", "torch.fx._symbolic_trace"):  # chatty, not actionable
        logging.getLogger(name).setLevel(logging.ERROR)
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints)
    sharders = get_default_sharders()
    plan = planner.collective_plan(model, sharders, pg)
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(pg), device=device, plan=plan,
                                   sharders=sharders, init_data_parallel=world > 1)
    if world == 1 and device.type != "cpu":
        # without the DDP wrap DMP leaves the dense part where it was built; move it as the wrap would
        dmp._dmp_wrapped_module.to(device)
    return dmp


def _table_configs(m: nn.Module) -> list[Any]:
    return m.embedding_bag_configs() if isinstance(m, EmbeddingBagCollection) else m.embedding_configs()


def build_run_model(schema: FeatureSchema, cfg: RunConfig, device: torch.device,
                    pg: dist.ProcessGroup) -> tuple[nn.Module, nn.Module]:
    """(sharded model to train/evaluate, the plain model inside it for FLOPs and introspection)."""
    torch.manual_seed(cfg.train.seed)
    model = build_model(schema, cfg.model)
    apply_sparse_optimizer(model, cfg.train)
    return shard_model(model, device, pg), model


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, DistributedModelParallel) else model


# --------------------------------------------------------------------------- data
def prepare_data(cfg: DataConfig, run_dir: str | Path, data_dir: str | Path | None = None) -> Path:
    """The dataset folder of a run: --data, else data.path, else the embedded default in RUN/data."""
    if data_dir or cfg.path:
        path = Path(data_dir or cfg.path)
        Dataset(path)  # fail early and clearly when it is not a dataset
        return path.resolve()
    from opengem.data.sim_config import SimConfig
    from opengem.data.simulate import simulate

    sim = SimConfig.from_dict(dict(cfg.sim))
    path = (Path(run_dir) / "data").resolve()
    marker = path / SIM_MARKER
    if marker.exists() and json.loads(marker.read_text()) == sim.to_dict():
        return path  # same simulator config: reuse
    shutil.rmtree(path, ignore_errors=True)
    simulate(sim, path)
    marker.write_text(json.dumps(sim.to_dict()))
    return path


def make_loader(ds: Dataset, spec: str, cfg: DataConfig, *, train: bool, seed: int = 0) -> Any:
    from opengem.data.loader import ParquetLoader

    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    batch_size = cfg.batch_size if train or not cfg.eval_batch_size else cfg.eval_batch_size
    return ParquetLoader(ds.files(spec), ds.schema, batch_size, rank=rank, world_size=world,
                         num_workers=cfg.num_workers, on_error=cfg.on_error or None, drop_last=train,
                         shuffle_units=train and cfg.shuffle, seed=seed)


def task_weights(schema: FeatureSchema, device: torch.device) -> torch.Tensor:
    return torch.tensor([t.weight for t in schema.tasks], dtype=torch.float32, device=device)


# --------------------------------------------------------------------------- logging
class RunLog:
    """metrics.jsonl + TensorBoard: every record goes to both."""

    def __init__(self, run_dir: Path, enabled: bool = True) -> None:
        self.enabled = enabled
        self._file = open(run_dir / "metrics.jsonl", "a") if enabled else None  # noqa: SIM115
        self._tb = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(run_dir / "tb"))

    def write(self, record: dict[str, Any], step: int) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        for k, v in _flatten(record).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step" and math.isfinite(v):
                self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self._file:
            self._file.close()
        if self._tb:
            self._tb.close()


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "/"))
        else:
            out[key] = v
    return out


# --------------------------------------------------------------------------- training
def train(cfg: RunConfig, run_dir: str | Path, data_dir: str | Path | None = None) -> dict[str, Any]:
    """Train per ``cfg`` and write the run folder; returns the summary also written to train_summary.json."""
    from opengem.train.evaluate import evaluate_model

    cfg.validate()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.train.device)
    data_path = prepare_data(cfg.data, run_dir, data_dir)
    cfg.data.path = str(data_path)  # the resolved config names the data it trained on
    ds = Dataset(data_path)
    schema = ds.schema
    t = cfg.train

    with process_group(device) as pg, cpu_threads(t.threads):
        is_main = dist.get_rank() == 0
        if is_main:
            save_config(cfg, run_dir / "config.toml")
        model, plain = build_run_model(schema, cfg, device, pg)
        dense = dense_parameters(model)
        dense_list = list(dense.values())
        opt = build_dense_optimizer(dense, t)
        sched = build_scheduler(opt, t)
        fused = getattr(model, "fused_optimizer", None)
        weights = task_weights(schema, device)
        flops = int(plain.flops_per_example()) if hasattr(plain, "flops_per_example") else None
        log = RunLog(run_dir, enabled=is_main)
        log.write({"kind": "setup", "model": cfg.model.name, "flops_per_example": flops,
                   "dense_params": sum(p.numel() for p in dense_list),
                   "embedding_params": sum(v * d for v, d in schema.tables().values()),
                   "device": str(device), "world_size": dist.get_world_size(), "data": str(data_path)}, 0)

        bar = None
        if t.progress and is_main:
            from tqdm import tqdm

            bar = tqdm(total=t.steps or None, unit="step", desc=f"train {cfg.model.name}", dynamic_ncols=True)

        step, examples, epoch, problems = 0, 0, 0, []
        t_start = time.perf_counter()
        window_loss, window_n, window_ex, window_t = 0.0, 0, 0, time.perf_counter()
        first_loss = last_loss = None
        done = False
        try:
            while not done:
                loader = make_loader(ds, cfg.data.train, cfg.data, train=True, seed=t.seed + epoch)
                seen_in_epoch = 0
                for batch in loader:
                    model.train()
                    batch = batch.to(device)
                    out = model(batch)
                    loss = masked_bce(out.logits, batch.labels, batch.label_mask, weights)
                    if not torch.isfinite(loss):
                        raise TrainError(f"step {step}: loss is {loss.item()} "
                                         "(lower train.lr or check the data)")
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    gnorm = clip_dense_gradients(dense_list, t.grad_clip)
                    opt.step()
                    sched.step()
                    step += 1
                    seen_in_epoch += 1
                    bsz = batch.batch_size
                    examples += bsz
                    lv = float(loss.detach())
                    first_loss = lv if first_loss is None else first_loss
                    last_loss = lv
                    window_loss += lv
                    window_n += 1
                    window_ex += bsz
                    if bar is not None:
                        bar.update(1)
                    if step % t.log_every == 0:
                        now = time.perf_counter()
                        rate = window_ex / max(now - window_t, 1e-9)
                        log.write({"kind": "train", "step": step, "epoch": epoch,
                                   "loss": window_loss / window_n, "lr": opt.param_groups[0]["lr"],
                                   "grad_norm": gnorm, "examples": examples, "examples_per_s": rate}, step)
                        if bar is not None:
                            bar.set_postfix(loss=f"{window_loss / window_n:.4f}", ex_s=f"{rate:,.0f}")
                        window_loss, window_n, window_ex, window_t = 0.0, 0, 0, now
                    if t.eval_every and step % t.eval_every == 0:
                        res = evaluate_model(model, make_loader(ds, cfg.data.eval, cfg.data, train=False),
                                             schema, device, max_batches=t.eval_max_batches)
                        log.write({"kind": "eval", "step": step, **_short(res)}, step)
                    if t.checkpoint_every and step % t.checkpoint_every == 0:
                        ckpt.save_model(model, ckpt.checkpoint_dir(run_dir, step), step)
                    if t.steps and step >= t.steps:
                        done = True
                        break
                if loader.problems.total:
                    problems.append(f"epoch {epoch}: {loader.problems.report()}")
                if seen_in_epoch == 0:
                    raise TrainError(f"{data_path}: partitions {cfg.data.train!r} gave no full batch of "
                                     f"{cfg.data.batch_size} rows (lower data.batch_size)")
                epoch += 1
                if not t.steps and epoch >= t.epochs:
                    done = True
        finally:
            if bar is not None:
                bar.close()
        train_s = time.perf_counter() - t_start
        ckpt.save_model(model, ckpt.checkpoint_dir(run_dir), step)
        final_eval = None
        if t.final_eval:
            final_eval = evaluate_model(model, make_loader(ds, cfg.data.eval, cfg.data, train=False), schema,
                                        device)
            log.write({"kind": "eval", "step": step, "final": True, **_short(final_eval)}, step)
        summary = {
            "model": cfg.model.name, "steps": step, "epochs": epoch, "examples": examples,
            "train_seconds": train_s, "examples_per_s": examples / max(train_s, 1e-9),
            "first_loss": first_loss, "last_loss": last_loss, "flops_per_example": flops,
            "device": str(device), "checkpoint": str(ckpt.checkpoint_dir(run_dir)),
            "final_eval": final_eval["metrics"] if final_eval else None,
            "sparse_optimizer": type(fused).__name__ if fused is not None else None,
            "data_problems": problems,  # rows skipped or repaired by the loader under the schema's policies
        }
        if is_main:
            (run_dir / "train_summary.json").write_text(json.dumps(summary, indent=2))
        log.close()
    return summary


def _short(res: dict[str, Any]) -> dict[str, Any]:
    """The per-key NE/AUC of an evaluation, compact enough for one metrics.jsonl line."""
    return {"loss": res["loss"],
            "metrics": {k: {"ne": v["ne"], "auc": v["auc"]} for k, v in res["metrics"].items()}}
