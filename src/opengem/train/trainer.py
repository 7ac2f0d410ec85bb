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
import math
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed import DistributedModelParallel

from opengem.config import flatten_dict, save_config
from opengem.data.dataset import Dataset
from opengem.data.schema import FeatureSchema
from opengem.errors import OpengemError
from opengem.model.registry import build_model
from opengem.train import checkpoint as ckpt
from opengem.train import distributed
from opengem.train.compile import compile_counters
from opengem.train.config import DataConfig, RunConfig, TrainConfig
from opengem.train.optim import (
    apply_sparse_optimizer,
    build_optimizers,
)
from opengem.train.parallelize import full_state, init_from_full, parallelize, shard_tables, table_names
from opengem.train.startup import StartupTimer
from opengem.train.step import forward_loss, optimizer_step

SIM_MARKER = ".opengem_sim_config.json"


class TrainError(OpengemError, RuntimeError):
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
def process_group(device: torch.device, timeout_s: float = 600.0) -> Iterator[dist.ProcessGroup]:
    """The existing default group, torchrun's, or a private 1-process one (see train/distributed.py)."""
    with distributed.process_group(device, timeout_s) as pg:
        yield pg


def shard_model(model: nn.Module, device: torch.device, pg: dist.ProcessGroup,
                cfg: TrainConfig | None = None) -> nn.Module:
    """Tables sharded by TorchRec's planner (``parallelize.shard_tables``); dense part left unsharded."""
    if not table_names(model):
        return model.to(device)
    return shard_tables(model, device, pg, cfg or TrainConfig())


def build_run_model(schema: FeatureSchema, cfg: RunConfig, device: torch.device,
                    pg: dist.ProcessGroup, timer: StartupTimer | None = None) -> tuple[nn.Module, nn.Module]:
    """(sharded model to train/evaluate, the plain model inside it for FLOPs and introspection).

    Every rank builds the same full model from the seed and the sharded model copies its shards from
    it, so the initial parameters do not depend on the world size or sharding plan.
    """
    timer = timer or StartupTimer()
    with timer.phase("model_build"):
        torch.manual_seed(cfg.train.seed)
        model = build_model(schema, cfg.model)
        full = full_state(model)
        apply_sparse_optimizer(model, cfg.train)
    with timer.phase("sharding"):
        mesh = distributed.dense_mesh(device, cfg.train.dp_replicate, cfg.train.dp_shard)
        sharded, info = parallelize(model, mesh, cfg.train, device, pg)
        init_from_full(sharded, full)
    sharded.parallel_info = info  # plan, FSDP units, mesh, dense_grad_scale
    torch.manual_seed(cfg.train.seed + distributed.rank())  # e.g. dropout: a different stream per rank
    return sharded, model


def prepare_compile(cfg: RunConfig) -> dict[str, Any]:
    """With ``train.compile``: the persistent cache folder, and static sequence shapes (no recompiles)."""
    if not cfg.train.compile:
        return {}
    from opengem.train.compile import configure_compile_cache

    cache = configure_compile_cache(cfg.train.compile_cache_dir or None)
    cfg.model.embedding.pad_to_max_len = True  # saved in config.toml, so evaluation rebuilds the same
    return {"cache_dir": str(cache), "backend": cfg.train.compile_backend}


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
                         shuffle_units=train and cfg.shuffle, seed=seed,
                         shuffle_window=cfg.shuffle_window if train else 0)  # evaluation never mixes rows


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
        for k, v in flatten_dict(record, "/").items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step" and math.isfinite(v):
                self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self._file:
            self._file.close()
        if self._tb:
            self._tb.close()




# --------------------------------------------------------------------------- training
def train(cfg: RunConfig, run_dir: str | Path, data_dir: str | Path | None = None, *, resume: bool = False,
          timer: StartupTimer | None = None) -> dict[str, Any]:
    """Train per ``cfg`` and write the run folder; returns the summary also written to train_summary.json.

    ``resume``: continue from the newest complete checkpoint in RUN/checkpoints (model, optimizers, lr
    schedule, loader position, RNG, counters), or start afresh when there is none. Under torchrun every
    rank calls this; rank 0 writes the run folder's files.
    """
    from opengem.train.evaluate import evaluate_model

    timer = timer or StartupTimer()
    cfg.validate()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.train.device)
    t = cfg.train

    with process_group(device, t.dist_timeout_s) as pg, cpu_threads(t.threads):
        is_main = dist.get_rank() == 0
        world = dist.get_world_size()
        with timer.phase("data_setup"):
            if not is_main:
                distributed.barrier()  # rank 0 simulates the embedded default first; the others reuse it
            data_path = prepare_data(cfg.data, run_dir, data_dir)
            if is_main:
                distributed.barrier()
            cfg.data.path = str(data_path)  # the resolved config names the data it trained on
            ds = Dataset(data_path)
            schema = ds.schema
        compile_info = prepare_compile(cfg)  # before the model is built: it may pad sequences
        if is_main:
            save_config(cfg, run_dir / "config.toml")
        model, plain = build_run_model(schema, cfg, device, pg, timer)
        dense_list, opt, sched, fused = build_optimizers(model, t)
        grad_scale = float(getattr(model, "parallel_info", {}).get("dense_grad_scale", 1))
        resumed = None
        start_step, start_epoch, start_examples, first_loss_saved, loader_state = 0, 0, 0, None, None
        if resume:
            with timer.phase("checkpoint_load"):
                try:
                    path = ckpt.latest_checkpoint(run_dir)
                except ckpt.CheckpointError:
                    path = None  # nothing saved yet: a fresh start
                if path is not None:
                    meta = ckpt.load(path, model, dense_opt=opt, sparse_opt=fused, scheduler=sched)
                    extra = meta.get("extra", {})
                    start_step, start_epoch = int(meta["step"]), int(extra.get("epoch", 0))
                    start_examples = int(extra.get("examples", 0))
                    first_loss_saved, loader_state = extra.get("first_loss"), meta.get("loader")
                    resumed = {"checkpoint": str(path), "step": start_step,
                               "saved_world_size": meta["world_size"]}
        weights = task_weights(schema, device)
        flops = int(plain.flops_per_example()) if hasattr(plain, "flops_per_example") else None
        log = RunLog(run_dir, enabled=is_main)
        log.write({"kind": "setup", "model": cfg.model.name, "flops_per_example": flops,
                   "dense_params": sum(p.numel() for p in dense_list),
                   "embedding_params": sum(v * d for v, d in schema.tables().values()),
                   "device": str(device), "world_size": world, "data": str(data_path),
                   "parallel": {k: v for k, v in getattr(model, "parallel_info", {}).items() if k != "plan"},
                   "resumed": resumed}, start_step)

        bar = None
        if t.progress and is_main:
            from tqdm import tqdm

            bar = tqdm(total=t.steps or None, unit="step", desc=f"train {cfg.model.name}", dynamic_ncols=True)

        step, examples, epoch, problems = start_step, start_examples, start_epoch, []
        if bar is not None and step:
            bar.update(step)
        t_start = time.perf_counter()
        window_loss, window_n, window_ex, window_t = 0.0, 0, 0, time.perf_counter()
        first_loss, last_loss = first_loss_saved, None
        done = bool((t.steps and step >= t.steps) or (not t.steps and epoch >= t.epochs))
        step_seconds, first_step_done, t_step = 0.0, False, time.perf_counter()
        end_position = loader_state  # the loader position saved with the final checkpoint
        try:
            while not done:
                loader = make_loader(ds, cfg.data.train, cfg.data, train=True, seed=t.seed + epoch)
                if loader_state is not None:
                    loader.load_state_dict(loader_state)  # the saved position, merged over the saved ranks
                    loader_state = None
                seen_in_epoch = 0
                t_step = time.perf_counter()
                for batch in distributed.until_any_exhausted(loader, device):
                    batch = batch.to(device)
                    loss = forward_loss(model, batch, weights, t, device)
                    if world > 1:
                        # this rank's share of the global-batch mean: sum / (labels over all ranks)
                        n_local = batch.label_mask.bool().sum().to(loss.dtype)
                        loss = loss * n_local / distributed.all_reduce_sum(n_local).clamp(min=1)
                    if not torch.isfinite(loss):
                        raise TrainError(f"step {step}: loss is {loss.item()} "
                                         "(lower train.lr or check the data)")
                    gnorm = optimizer_step(loss, opt, sched, dense_list, t.grad_clip, grad_scale)
                    step += 1
                    seen_in_epoch += 1
                    distributed.maybe_inject_failure(step)
                    bsz = batch.batch_size * world
                    examples += bsz
                    lv = float(distributed.all_reduce_sum(loss.detach()) if world > 1 else loss.detach())
                    now = time.perf_counter()
                    if first_step_done:
                        step_seconds += now - t_step
                    else:
                        timer.add("first_step", now - t_step)
                        first_step_done = True
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
                        ckpt.save(ckpt.checkpoint_dir(run_dir, step), step, model, dense_opt=opt,
                                  sparse_opt=fused, scheduler=sched, loader_state=loader.state_dict(),
                                  keep=t.keep_checkpoints,
                                  extra={"epoch": epoch, "examples": examples, "first_loss": first_loss})
                    if t.steps and step >= t.steps:
                        done = True
                        end_position = loader.state_dict()  # mid-epoch: a later --resume with more steps
                        break
                    t_step = time.perf_counter()
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
        ckpt.save(ckpt.checkpoint_dir(run_dir), step, model, dense_opt=opt, sparse_opt=fused, scheduler=sched,
                  loader_state=end_position,
                  extra={"epoch": epoch, "examples": examples, "first_loss": first_loss})
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
            "world_size": world, "resumed": resumed,
            "parallel": {k: v for k, v in getattr(model, "parallel_info", {}).items()},
            "startup": timer.summary(step_seconds),
            "peak_rss_mb_per_rank": distributed.gather_objects(_peak_rss_mb()),
            "compile": {**compile_info, **compile_counters()} if compile_info else None,
            "memory": {"activation_checkpointing": t.activation_checkpointing, "precision": t.precision,
                       "fp8_saved_activations": t.fp8_saved_activations},
        }
        if is_main:
            (run_dir / "train_summary.json").write_text(json.dumps(summary, indent=2))
        log.close()
    return summary


def _peak_rss_mb() -> float:
    """Peak resident memory of this process (Linux: ru_maxrss is in KiB)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _short(res: dict[str, Any]) -> dict[str, Any]:
    """The per-key NE/AUC of an evaluation, compact enough for one metrics.jsonl line."""
    return {"loss": res["loss"],
            "metrics": {k: {"ne": v["ne"], "auc": v["auc"]} for k, v in res["metrics"].items()}}
