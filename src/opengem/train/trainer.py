"""The one Trainer: every kind of training (a run, online training, the benchmark, the quality harness,
vertical models) builds one and calls its methods; none writes its own loop of zero_grad/backward/step.

torchtitan-style: the constructor builds everything once -- device, process group, data, the parallelized
model (TorchRec DMP for tables, FSDP2 for dense blocks, compile and memory savers applied from outside),
optimizers, checkpointer, validator and run log; ``train_step(batch)`` takes one step through the shared
``opengem.train.step`` (precision, FP8 saved activations, task-weighted masked BCE plus any extra losses a
caller hooks in, dense gradient scaling and clipping); ``evaluate()``; ``fit()`` runs the loop, in which
components decide their own timing (``checkpointer.should_save(step)``, ``validator.should_run(step)``);
``state_dict()`` / ``load_state_dict()`` carry the counters a resume needs.

Outputs in RUN/ (when there is a run folder): run.json (the run id), config.toml (resolved), metrics.jsonl
(one JSON record per log/eval/early-stopping decision), tb/ (TensorBoard), checkpoints/ (DCP; with
``train.early_stop`` also checkpoints/best, the weights of the best evaluation, which the final evaluation,
``opengem evaluate`` and ``opengem predict`` use), train_summary.json (with peak memory and, with early
stopping, which step won). Before training the output bias of each (surface, task) starts at the logit of
its base rate in ``data.train`` (``train.init_output_bias``); ``train.embedding_l2`` adds an L2 term on the
embeddings each batch looks up (train/optim.py). The folder is
locked and owned by one run for its life (train/run_dir.py). SIGINT/SIGTERM during ``fit`` finish the step,
save a periodic checkpoint and end the run with :class:`RunInterrupted` (exit 130/143), so ``--resume``
continues exactly. Without a run folder (vertical models trained in memory by the transfer experiment)
nothing is written and nothing is locked.

The model always goes through TorchRec's DistributedModelParallel, even alone on a CPU, so the fused
sparse optimizer runs and the multi-process path (torchrun) differs only in the process group. When no
process group exists, a 1-process one is created (train/distributed.py) and destroyed by ``close()``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import resource
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn
from tqdm import tqdm

from opengem.config import ConfigError, save_config
from opengem.data.batch import Batch
from opengem.data.dataset import Dataset
from opengem.data.schema import FeatureSchema
from opengem.data.splits import check_disjoint
from opengem.errors import OpengemError, TrainError
from opengem.model.heads import MultiSurfaceHead
from opengem.model.output import ModelOutput
from opengem.model.registry import build_model
from opengem.ops.triton import interpreting as triton_interpreting
from opengem.train import checkpoint as ckpt
from opengem.train import distributed
from opengem.train import run_dir as rundir
from opengem.train.compile import compile_counters, prepare_compile
from opengem.train.config import RunConfig
from opengem.train.cpu_linear import run_cpu_linear
from opengem.train.data import data_location, make_loader, prepare_data
from opengem.train.early_stop import EarlyStopper
from opengem.train.early_stop import score as early_stop_score
from opengem.train.env import cpu_threads, resolve_device
from opengem.train.evaluate import BEST, EvalDataError, LogitObserver, Validator, evaluate_model
from opengem.train.memory import slow_bf16_warning
from opengem.train.optim import EmbeddingL2, build_optimizers
from opengem.train.parallelize import build_run_model
from opengem.train.pipeline import PositionedBatches, SparseDistPipeline
from opengem.train.run_log import RunLog, short_metrics
from opengem.train.signals import StopSignals
from opengem.train.startup import StartupTimer
from opengem.train.step import dense_step, forward, label_loss, optimizer_step, task_weights

__all__ = ["ExtraLosses", "RunInterrupted", "TrainError", "Trainer", "train"]

# Extra terms of the loss (knowledge distillation, ...): (model output, batch) -> {name: scalar loss}.
ExtraLosses = Callable[[ModelOutput, Batch], dict[str, torch.Tensor]]


RESUME_ADVICE = "run the same command with --resume to continue"


class RunInterrupted(TrainError):
    """SIGINT/SIGTERM stopped the run after a step; the message says where it was saved and how to go on.

    ``exit_code`` is the shell's for the signal (130 SIGINT, 143 SIGTERM). The advice is ``train``'s and
    ``distill``'s (``--resume``); a command that goes on by running it again says so (:meth:`advising`,
    the command module's ``INTERRUPTED_ADVICE``, which the CLI applies)."""

    def __init__(self, what: str, exit_code: int) -> None:
        super().__init__(f"{what}; {RESUME_ADVICE}")
        self.what = what
        self.exit_code = exit_code

    def advising(self, advice: str) -> str:
        """The message with another way to go on."""
        return f"{self.what}; {advice}"


NO_RUN = {"run_id": None, "checkpoint_run_id": None, "continuing": False, "moved_aside": None,
          "config_changes": {}}


class Trainer:
    """One model's training. See the module docstring; arguments beyond ``train``'s:

    ``schema``: read the dataset with this schema (a vertical model's view of a shared dataset);
    ``plain``: train this already built plain model instead of building ``cfg.model`` (its parameters
    are copied into the shards as they are); ``lr_scale``: ``id(parameter)`` -> multiplier of its
    learning rates, 0 = frozen (parameters shared from an FM); ``extra_losses``: added to the label loss
    at every step (it may be replaced between calls, e.g. a new teacher per window).
    """

    def __init__(self, cfg: RunConfig, run_dir: str | Path | None = None, data_dir: str | Path | None = None,
                 *, resume: bool = False, force: bool = False, allow_config_change: bool = False,
                 timer: StartupTimer | None = None, schema: FeatureSchema | None = None,
                 plain: nn.Module | None = None, lr_scale: dict[int, float] | None = None,
                 extra_losses: ExtraLosses | None = None) -> None:
        self.timer = timer or StartupTimer()
        cfg.validate()
        self.cfg, self.t = cfg, cfg.train
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.device = resolve_device(cfg.train.device)
        check_kernel_device(cfg, self.device)
        self.compile_info = prepare_compile(cfg)  # before the resume check and the model: may pad sequences
        self.extra_losses = extra_losses
        self.warnings: list[str] = []  # printed and recorded (metrics.jsonl, train_summary.json)
        self._stack = contextlib.ExitStack()
        try:
            self._build(data_dir, resume, force, allow_config_change, schema, plain, lr_scale)
        except BaseException:
            self._stack.__exit__(*sys.exc_info())  # the contexts see the error (the process group logs it)
            raise

    # ----------------------------------------------------------------------- construction
    def _build(self, data_dir: str | Path | None, resume: bool, force: bool, allow_config_change: bool,
               schema: FeatureSchema | None, plain: nn.Module | None, lr_scale: dict[int, float] | None
               ) -> None:
        cfg, t, timer, stack = self.cfg, self.t, self.timer, self._stack
        self.pg = stack.enter_context(distributed.process_group(self.device, t.dist_timeout_s))
        stack.enter_context(cpu_threads(t.threads))
        self.is_main, self.world = distributed.is_main(), distributed.world_size()
        self.allow_config_change = allow_config_change
        self.run = (_own_run(stack, cfg, self.run_dir, data_dir, resume=resume, force=force,
                             allow_config_change=allow_config_change)
                    if self.run_dir is not None else dict(NO_RUN))
        if self.is_main and self.run["config_changes"]:
            print("opengem train: warning: resuming with a changed config (--allow-config-change): "
                  + rundir.shown_changes(self.run["config_changes"]), file=sys.stderr)
        with timer.phase("data_setup"):
            if self.run_dir is None:
                data_path = Path(data_dir or cfg.data.path)
            else:
                if not self.is_main:
                    distributed.barrier()  # rank 0 simulates the embedded default first; the others reuse it
                data_path = prepare_data(cfg.data, self.run_dir, data_dir)
                if self.is_main:
                    distributed.barrier()
            cfg.data.path = str(data_path)  # the resolved config names the data it trained on
            self.data_path = data_path
            self.ds = Dataset(data_path, schema)
            self.schema = self.ds.schema
            if self.run_dir is not None and (t.final_eval or t.eval_every):
                # metrics on rows the model trained on would flatter it
                check_disjoint(self.ds.select(cfg.data.train), self.ds.select(cfg.data.eval), data_path,
                               cfg.data.train, cfg.data.eval)
            if t.early_stop.enabled:
                self._check_early_stop_partition()
        if self.is_main and self.run_dir is not None and not resume:
            save_config(cfg, self.run_dir / "config.toml")
        self.base_rates: list[list[float | None]] | None = None
        if t.init_output_bias and plain is None:  # a caller's own plain model keeps the init it was given
            with timer.phase("output_bias_init"):
                plain = self._model_with_prior_bias()
        slow_bf16 = slow_bf16_warning(t.precision, self.device)
        if slow_bf16 is not None:
            self._warn(slow_bf16)
        # train.cpu_linear = auto: decided once for the run, kept across --resume; the model gets the kernel
        kernel = run_cpu_linear(t.cpu_linear, self.device, self.run_dir, resume)
        model_cfg = replace(cfg, train=replace(t, cpu_linear=kernel)) if kernel != t.cpu_linear else cfg
        self.parallel = build_run_model(self.schema, model_cfg, self.device, self.pg, timer, plain=plain,
                                        lr_scale=lr_scale)
        self.model = self.parallel.model
        self.optimizers = build_optimizers(self.model, t, lr_scale)
        self.emb_l2 = EmbeddingL2(self.model, t.embedding_l2) if t.embedding_l2 > 0 else None
        self.stopper = EarlyStopper(t.early_stop) if t.early_stop.enabled else None
        self.weights = task_weights(self.schema, self.device)
        self.checkpointer = (ckpt.Checkpointer(self.run_dir, t.checkpoint_every, t.keep_checkpoints,
                                               self.run["run_id"]) if self.run_dir is not None else None)
        self.validator = Validator(t.eval_every, t.eval_max_batches)
        self.step = self.epoch = self.examples = 0
        self.first_loss: float | None = None
        self.last_loss: float | None = None
        self.last_grad_norm = 0.0
        self.last_parts: dict[str, float] = {}
        self._window: list[Any] = [0.0, 0, 0]  # the log window: loss sum, steps, examples
        self.loader_state: dict[str, Any] | None = None
        self._pipeline: SparseDistPipeline | None = None  # train.pipeline = "sparse_dist", during fit()
        self.resumed: dict[str, Any] | None = None
        if resume and self.checkpointer is not None:
            with timer.phase("checkpoint_load"):
                self._resume()
        if resume and self.is_main and self.run_dir is not None:
            # only once the checkpoint loaded: a resume that fails (a changed model under
            # --allow-config-change) leaves config.toml naming the model the checkpoints hold
            save_config(cfg, self.run_dir / "config.toml")
        rolled_back = (rundir.rollback_log(self.run_dir, self.step, redo_final=t.final_eval)
                       if self.run["continuing"] and self.is_main else 0)
        self.log = RunLog(self.run_dir, enabled=self.is_main and self.run_dir is not None,
                          purge_step=self.step + 1 if self.run["continuing"] else None)
        stack.callback(self.log.close)
        plain_model = self.parallel.plain
        has_flops = hasattr(plain_model, "flops_per_example")
        self.flops = int(plain_model.flops_per_example()) if has_flops else None
        self.log.write({"kind": "setup", "model": cfg.model.name, "run_id": self.run["run_id"],
                        "flops_per_example": self.flops,
                        "dense_params": sum(p.numel() for p in self.optimizers.dense),
                        "embedding_params": sum(v * d for v, d in self.schema.tables().values()),
                        "device": str(self.device), "world_size": self.world, "data": str(data_path),
                        "parallel": {k: v for k, v in self.parallel.info.items() if k != "plan"},
                        "resumed": self.resumed, "log_records_rolled_back": rolled_back,
                        "moved_aside": self.run["moved_aside"], "allow_config_change": allow_config_change,
                        "config_changes": self.run["config_changes"],
                        "output_bias_base_rates": self.base_rates}, self.step)

    def _check_early_stop_partition(self) -> None:
        """Choosing the step on rows the model trained on would flatter it: refuse overlapping selections."""
        spec, train_spec = self.t.early_stop.partition, self.cfg.data.train
        trained = self.ds.select(train_spec)
        shared = [p for p in self.ds.select(spec) if p in trained]
        if shared:
            raise ConfigError(f"{self.data_path}: train.early_stop.partition ({spec!r}) and data.train "
                              f"({train_spec!r}) both select {', '.join(shared)}; choose disjoint partitions "
                              "(e.g. \"@valid\")")

    def _warn(self, msg: str) -> None:
        """Record a warning for train_summary.json and print it once (the main rank)."""
        self.warnings.append(msg)
        if self.is_main:
            print(f"opengem train: warning: {msg}", file=sys.stderr)

    def _model_with_prior_bias(self) -> nn.Module:
        """The plain model exactly as build_run_model would build it, its output biases at the logits of
        the train partitions' base rates (recorded in ``self.base_rates``)."""
        torch.manual_seed(self.t.seed)
        plain = build_model(self.schema, self.cfg.model)
        rates, unreadable = label_base_rates(self.ds, self.cfg.data.train)
        if unreadable:
            msg = (f"output biases start from the base rates of the readable files only; skipped "
                   f"{len(unreadable)}: {unreadable[0]}" + (" ..." if len(unreadable) > 1 else ""))
            self._warn(msg)
        for head in (m for m in plain.modules() if isinstance(m, MultiSurfaceHead)):
            head.init_output_bias(rates)
        self.base_rates = [[None if r != r else r for r in row] for row in rates.tolist()]
        return plain

    def _resume(self) -> None:
        candidates = self.checkpointer.newest_first(self.run["checkpoint_run_id"])
        if not candidates:
            return  # nothing saved yet: a fresh start
        o = self.optimizers
        for i, path in enumerate(candidates):
            try:
                meta = ckpt.load(path, self.model, dense_opt=o.dense_opt, sparse_opt=o.sparse,
                                 scheduler=o.scheduler)
                break
            except ckpt.TruncatedCheckpoint as e:  # "from its newest complete checkpoint" (README)
                if i == len(candidates) - 1:
                    raise
                self._warn(f"{e}: resuming from the checkpoint before it, {candidates[i + 1]}")
        self.step = int(meta["step"])
        self.load_state_dict(meta.get("extra", {}))
        self.loader_state = meta.get("loader")
        self.resumed = {"checkpoint": str(path), "step": self.step, "saved_world_size": meta["world_size"]}
        saved = int(meta.get("world_size") or self.world)
        if saved != self.world:  # allowed (a machine count changes), but not the same run from here on
            bs = self.cfg.data.batch_size
            self._warn(f"resumed in {self.world} process(es) a run saved by {saved}: data.batch_size is per "
                       f"process, so the global batch goes from {bs * saved} to {bs * self.world} rows and "
                       "the run no longer continues as it would have")

    # ----------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The counters a checkpoint carries beside model, optimizers and loader position (JSON)."""
        return {"epoch": self.epoch, "examples": self.examples, "first_loss": self.first_loss,
                "log_window": list(self._window),
                "early_stop": self.stopper.state_dict() if self.stopper is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state.get("epoch", 0))
        self.examples = int(state.get("examples", 0))
        self.first_loss = state.get("first_loss")
        self._window = list(state.get("log_window") or [0.0, 0, 0])
        if self.stopper is not None and state.get("early_stop"):
            self.stopper.load_state_dict(state["early_stop"])

    def save_checkpoint(self, *, final: bool = False, loader_state: dict[str, Any] | None = None) -> Path:
        """Collective. Periodic at the current step, or the run's final checkpoint."""
        if self.checkpointer is None:
            raise TrainError("this trainer has no run folder to save checkpoints in")
        o = self.optimizers
        return self.checkpointer.save(self.step, self.model, dense_opt=o.dense_opt, sparse_opt=o.sparse,
                                      scheduler=o.scheduler, loader_state=loader_state,
                                      extra=self.state_dict(), final=final)

    # ----------------------------------------------------------------------- steps
    def train_step(self, batch: Batch) -> float:
        """One optimizer step on ``batch`` (this rank's share of the global batch); returns the loss,
        summed over ranks (the global-batch mean)."""
        batch = batch.to_device(self.device)  # pinned and non-blocking on GPU
        loss = self._step_loss(batch)
        o = self.optimizers
        self.last_grad_norm = optimizer_step(loss, o.dense_opt, o.scheduler, o.dense, self.t.grad_clip,
                                             self.parallel.dense_grad_scale)
        return self._account(loss, batch)

    def _step_loss(self, batch: Batch) -> torch.Tensor:
        """The step's loss on a batch already on the device: label loss plus extras, this rank's share."""
        if self.emb_l2 is not None:
            self.emb_l2.take()  # nothing left over from a forward that did not end in a step
        out = forward(self.model, batch, self.t, self.device)
        loss = label_loss(out, batch, self.weights)
        parts: dict[str, float] = {}
        extras = dict(self.extra_losses(out, batch)) if self.extra_losses is not None else {}
        l2 = self.emb_l2.take() if self.emb_l2 is not None else None
        if l2 is not None:
            extras["embedding_l2"] = l2
        if extras or self.extra_losses is not None:
            parts["label"] = float(loss.detach())
            for name, extra in extras.items():
                parts[name] = float(extra.detach())
                loss = loss + extra
        if self.world > 1:
            # this rank's share of the global-batch mean: sum / (labels over all ranks)
            n_local = batch.label_mask.bool().sum().to(loss.dtype)
            loss = loss * n_local / distributed.all_reduce_sum(n_local).clamp(min=1)
        if not torch.isfinite(loss):
            raise TrainError(f"step {self.step}: loss is {loss.item()} (lower train.lr or check the data)")
        self.last_parts = parts
        return loss

    def _zero_grad(self) -> None:
        self.optimizers.dense_opt.zero_grad(set_to_none=True)

    def _dense_step(self) -> None:
        """The dense half of the step after backward (the train pipeline's optimizer ``step``)."""
        o = self.optimizers
        self.last_grad_norm = dense_step(o.dense_opt, o.scheduler, o.dense, self.t.grad_clip,
                                         self.parallel.dense_grad_scale)

    def _account(self, loss: torch.Tensor, batch: Batch) -> float:
        """Counters after a step: step, examples, the loss summed over ranks, the log window."""
        self.step += 1
        distributed.maybe_inject_failure(self.step)
        bsz = batch.batch_size * self.world
        self.examples += bsz
        lv = float(distributed.all_reduce_sum(loss.detach()) if self.world > 1 else loss.detach())
        self.first_loss = lv if self.first_loss is None else self.first_loss
        self.last_loss = lv
        self._window[0] += lv
        self._window[1] += 1
        self._window[2] += bsz
        return lv

    def _steps(self, loader: Any) -> Iterator[Callable[[], dict[str, Any]]]:
        """Train on ``loader``'s batches (all ranks alike), yielding after each step a callable that gives
        the loader position just after the batch trained (what a checkpoint saves)."""
        batches = distributed.until_any_exhausted(loader, self.device)
        if self._pipeline is None:
            for batch in batches:
                self.train_step(batch)
                yield loader.state_dict
            return
        read = PositionedBatches(batches, loader.state_dict, pin=self.device.type == "cuda")
        it = iter(read)
        try:
            while self._pipeline.step(it):
                position = read.trained()
                self._account(self._pipeline.last_loss, self._pipeline.last_batch)
                yield functools.partial(dict, position)
        finally:  # the end of the epoch, a loop that stopped early (closed) or an error
            self._pipeline.reset()  # batches read ahead are not trained; the tables get their forward back

    def evaluate(self, spec: str | None = None, *, batches: Any = None, max_batches: int = 0,
                 on_logits: LogitObserver | None = None) -> dict[str, Any]:
        """Metrics of the model now on ``spec`` (default ``data.eval``) or on ``batches`` (``on_logits``: see
        :func:`~opengem.train.evaluate.evaluate_model`)."""
        if self._pipeline is not None:
            self._pipeline.detach()  # the tables' own forward: the pipeline's returns its prefetched lookup
        if batches is None:
            batches = make_loader(self.ds, spec or self.cfg.data.eval, self.cfg.data, train=False)
        return evaluate_model(self.model, batches, self.schema, self.device, max_batches=max_batches,
                              on_logits=on_logits)

    def train_loader(self) -> Any:
        """This epoch's loader over ``data.train``, at the saved position when resuming."""
        loader = make_loader(self.ds, self.cfg.data.train, self.cfg.data, train=True,
                             seed=self.t.seed + self.epoch)
        if self.loader_state is not None:
            loader.load_state_dict(self.loader_state)  # the saved position, merged over the saved ranks
            self.loader_state = None
        elif self.step == 0 and self.epoch == 0 and self.cfg.data.skip_batches:
            want = self.cfg.data.skip_batches
            with self.timer.phase("skip_batches"):  # reading past them shows in the start-up breakdown
                have = loader.skip(want)
            # every rank learns every rank's count, so a rank with too few batches does not leave the others
            # waiting in the first step's collectives until dist_timeout: all of them stop with the same line
            counts = distributed.gather_objects(have)
            short = [(rank, n) for rank, n in enumerate(counts) if n < want]
            if short:
                where = (f"this rank only {have}" if len(counts) == 1
                         else ", ".join(f"rank {rank} only {n}" for rank, n in short))
                raise TrainError(f"{self.data_path}: data.skip_batches = {want}, but partitions "
                                 f"{self.cfg.data.train!r} give {where} full batches of "
                                 f"{self.cfg.data.batch_size} rows an epoch")
        return loader

    # ----------------------------------------------------------------------- the loop
    def _evaluate_or_warn(self, max_batches: int = 0) -> dict[str, Any] | None:
        """Evaluation during training; an eval set with nothing to evaluate is a warning, printed and
        recorded (metrics.jsonl, train_summary.json), not the end of a run whose training went well.

        ``max_batches`` > 0 (``train.eval_max_batches``): that many eval batches' rows per rank, taken as
        whole row groups spread evenly over the partitions (``data.loader.spread_units``), not their first
        rows: a day's file is in time order, and its first rows are its first minutes, not the day's mix
        (session 46 found a study's choices made on them)."""
        try:
            if not max_batches:
                return self.evaluate()
            d = self.cfg.data
            rows = max_batches * (d.eval_batch_size or d.batch_size) * distributed.world_size()
            return self.evaluate(batches=make_loader(self.ds, d.eval, d, train=False, spread_rows=rows))
        except EvalDataError as e:
            msg = (f"{self.data_path}: partitions {', '.join(self.ds.select(self.cfg.data.eval))} "
                   f"(data.eval = {self.cfg.data.eval!r}): {e}")
            if msg not in self.warnings:
                self._warn(msg)
                self.log.write({"kind": "warning", "step": self.step, "message": msg}, self.step)
            return None

    def _log_window(self, window_t: float) -> float:
        """Write the train record of the steps since the last one; returns the new window start."""
        now = time.perf_counter()
        loss_sum, n, ex = self._window
        rate = ex / max(now - window_t, 1e-9)
        o = self.optimizers
        self.log.write({"kind": "train", "step": self.step, "epoch": self.epoch, "loss": loss_sum / n,
                        "lr": o.dense_opt.param_groups[0]["lr"], "grad_norm": self.last_grad_norm,
                        "examples": self.examples, "examples_per_s": rate}, self.step)
        if self._bar is not None:
            self._bar.set_postfix(loss=f"{loss_sum / n:.4f}", ex_s=f"{rate:,.0f}")
        self._window = [0.0, 0, 0]
        return now

    def fit(self) -> dict[str, Any]:
        """Train to ``train.steps`` (or ``train.epochs``), save the final checkpoint, evaluate; returns the
        summary (also RUN/train_summary.json)."""
        t, cfg = self.t, self.cfg
        self._bar = None
        if t.progress and self.is_main:
            self._bar = tqdm(total=t.steps or None, unit="step", desc=f"train {cfg.model.name}",
                             dynamic_ncols=True)
            self._stack.callback(self._bar.close)
            if self.step:
                self._bar.update(self.step)
        problems: list[str] = []
        t_start = window_t = time.perf_counter()
        done = bool((t.steps and self.step >= t.steps) or (not t.steps and self.epoch >= t.epochs)
                    or (self.stopper is not None and self.stopper.stopped))  # early-stopped: stays stopped
        examples_at_start = self.examples  # a resumed run's rate counts what this process trained
        mid_epoch = False  # stopped inside an epoch: the final checkpoint's epoch is that one
        step_seconds, first_step_done = 0.0, False
        end_position = self.loader_state  # the loader position saved with the final checkpoint
        stop_code, stop_position = 0, None
        signals = StopSignals(announce=self.is_main)
        self._stack.callback(signals.restore)
        if t.pipeline == "sparse_dist":
            self._pipeline = SparseDistPipeline(self.model, self.device, self._step_loss,
                                                self._zero_grad, self._dense_step)
        while not done:
            resumed = self.loader_state is not None  # this epoch's loader starts at a saved position
            loader = self.train_loader()
            seen_in_epoch = 0
            t_step = time.perf_counter()
            # closed on every way out (a break, an error): a pipeline lets go of the batches it read ahead
            with contextlib.closing(self._steps(loader)) as steps:
                for position in steps:
                    seen_in_epoch += 1
                    now = time.perf_counter()
                    if first_step_done:
                        step_seconds += now - t_step
                    else:
                        self.timer.add("first_step", now - t_step)
                        first_step_done = True
                    if self._bar is not None:
                        self._bar.update(1)
                    if self.step % t.log_every == 0:
                        window_t = self._log_window(window_t)
                    if self.validator.should_run(self.step):
                        res = self._evaluate_or_warn(self.validator.max_batches)
                        if res is not None:
                            self.log.write({"kind": "eval", "step": self.step, **short_metrics(res)},
                                           self.step)
                        if self._early_stop_check(res, self.validator.max_batches):
                            done = mid_epoch = True
                            end_position = position()
                            break
                    if self.checkpointer.should_save(self.step):
                        self.save_checkpoint(loader_state=position())
                    if t.steps and self.step >= t.steps:
                        done = mid_epoch = True
                        end_position = position()  # mid-epoch: a later --resume with more steps
                        break
                    stop_code = signals.requested(self.device)
                    if stop_code:
                        stop_position = position()
                        break
                    t_step = time.perf_counter()
            if stop_code:
                break
            if loader.problems.total:
                problems.append(f"epoch {self.epoch}: {loader.problems.report()}")
            if seen_in_epoch == 0 and not resumed:  # resumed at the epoch's end: on to the next one
                raise TrainError(f"{self.data_path}: partitions {cfg.data.train!r} gave no full batch of "
                                 f"{cfg.data.batch_size} rows (lower data.batch_size)")
            if mid_epoch:  # the epoch goes on after a --resume with more steps: its shuffle seed is its own
                break
            self.epoch += 1
            if not t.steps and self.epoch >= t.epochs:
                done = True
            if not done and not self.validator.every and self.stopper is not None:
                # eval_every = 0: early stopping decides once per epoch
                if self._early_stop_check(None, 0):
                    done = True
                    end_position = loader.state_dict()
        signals.restore()  # from here on (final checkpoint, evaluation) Ctrl-C stops at once
        self._pipeline = None
        if stop_code:
            self._stop(stop_code, stop_position)
        train_s = time.perf_counter() - t_start
        if self.stopper is not None and not self.stopper.stopped and self.stopper.last_step != self.step:
            # the state training ended in is compared too (the last epoch with eval_every = 0, the steps
            # after the last periodic evaluation): "best" was otherwise chosen without it
            self._early_stop_check(None, 0)
        self.save_checkpoint(final=True, loader_state=end_position)
        best = self._restore_best()  # the final evaluation measures the model early stopping kept
        final_eval = None
        if t.final_eval:
            final_eval = self._evaluate_or_warn()
            if final_eval is not None:
                self.log.write({"kind": "eval", "step": self.step, "final": True,
                                **short_metrics(final_eval)}, self.step)
        summary = {
            "model": cfg.model.name, "run_id": self.run["run_id"], "steps": self.step,
            "epochs": self.epoch + mid_epoch,  # epochs begun
            "examples": self.examples,
            "train_seconds": train_s,
            "examples_per_s": (self.examples - examples_at_start) / max(train_s, 1e-9),
            "first_loss": self.first_loss, "last_loss": self.last_loss, "flops_per_example": self.flops,
            "device": str(self.device), "checkpoint": str(ckpt.checkpoint_dir(self.run_dir)),
            "final_eval": final_eval["metrics"] if final_eval else None,
            "sparse_optimizer": type(self.optimizers.sparse).__name__ if self.optimizers.sparse else None,
            "data_problems": problems,  # rows skipped or repaired by the loader under the schema's policies
            "warnings": self.warnings,
            "world_size": self.world, "resumed": self.resumed,
            "allow_config_change": self.allow_config_change, "config_changes": self.run["config_changes"],
            "parallel": dict(self.parallel.info),
            "startup": self.timer.summary(step_seconds),
            "peak_rss_mb_per_rank": distributed.gather_objects(peak_rss_mb()),
            "compile": {**self.compile_info, **compile_counters()} if self.compile_info else None,
            "memory": {"activation_checkpointing": t.activation_checkpointing, "precision": t.precision,
                       "fp8_saved_activations": t.fp8_saved_activations},
            "peak_rss_mb": max(distributed.gather_objects(peak_rss_mb())),  # a number: the report's column
            "peak_device_mem_mb": peak_device_mem_mb(self.device),
            "early_stop": best,
            "output_bias_base_rates": self.base_rates,
        }
        if self.is_main:
            (self.run_dir / "train_summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    # ----------------------------------------------------------------------- early stopping
    def _early_stop_check(self, res: dict[str, Any] | None, max_batches: int) -> bool:
        """After a periodic evaluation (``res`` on ``data.eval``, None = none usable): evaluate the early
        stopping selection (reusing ``res`` when it is the same full selection), save RUN/checkpoints/best
        on an improvement, log the decision; True = stop now."""
        if self.stopper is None:
            return False
        es = self.t.early_stop
        if res is None or es.partition != self.cfg.data.eval or max_batches:
            try:
                res = self.evaluate(es.partition)
            except EvalDataError as e:
                raise TrainError(f"{self.data_path}: train.early_stop.partition = {es.partition!r}: {e}"
                                 ) from None
        improved = self.stopper.update(self.step, res)
        if improved and self.run_dir is not None:
            ckpt.save(self.best_checkpoint_dir(), self.step, self.model, extra={"early_stop": True},
                      run_id=self.run["run_id"])
        self.log.write({"kind": "early_stop", "step": self.step, "improved": improved,
                        "value": ckpt_float(res, es.metric, es.key), **self.stopper.summary()}, self.step)
        return self.stopper.should_stop

    def best_checkpoint_dir(self) -> Path:
        return self.run_dir / ckpt.CHECKPOINTS / BEST

    def _restore_best(self) -> dict[str, Any] | None:
        """Load the best weights into the model (after the final checkpoint kept the last state for
        --resume); returns the early-stopping record for the summary, None when it is off."""
        if self.stopper is None:
            return None
        rec = self.stopper.summary()
        path = self.best_checkpoint_dir() if self.run_dir is not None else None
        if self.stopper.best_step is not None and path is not None and path.exists():
            ckpt.load_model(self.model, path)
            rec["checkpoint"] = str(path)
            if self.is_main:
                print(f"opengem train: early stopping kept step {self.stopper.best_step} "
                      f"({rec['metric']} {rec['best_value']:.6g} on {rec['partition']}); "
                      f"{'stopped early' if rec['stopped_early'] else 'ran to the end'}", file=sys.stderr)
        self.log.write({"kind": "early_stop", "step": self.step, "final": True, **rec}, self.step)
        return rec

    def _stop(self, code: int, position: dict[str, Any] | None) -> None:
        """After a stop signal: save a periodic checkpoint at this step (unless this step saved one) and
        raise :class:`RunInterrupted` saying where it went and how to continue, or why nothing was saved."""
        name = {130: "SIGINT", 143: "SIGTERM"}.get(code, f"signal (exit {code})")
        path = ckpt.checkpoint_dir(self.run_dir, self.step)
        if not self.checkpointer.should_save(self.step):
            try:
                self.save_checkpoint(loader_state=position)
            except (OSError, ckpt.CheckpointError) as e:
                raise RunInterrupted(
                    f"stopped by {name} at step {self.step}, but the checkpoint could not be saved "
                    f"({type(e).__name__}: {e}); the newest one in {self.run_dir / ckpt.CHECKPOINTS} is "
                    "kept", code) from None
        raise RunInterrupted(f"stopped by {name} at step {self.step}: saved {path}", code)

    # ----------------------------------------------------------------------- life
    def close(self) -> None:
        """Release the run folder's lock, the log, signal handlers and a private process group."""
        self._stack.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: Any) -> None:
        # the error, if any, goes to every context on the stack (close() would tell them all went well):
        # the process group then logs it with the rank and does not wait for the other ranks
        self._stack.__exit__(*exc)


def _own_run(stack: contextlib.ExitStack, cfg: RunConfig, run_dir: Path, data_dir: str | Path | None, *,
             resume: bool, force: bool, allow_config_change: bool) -> dict[str, Any]:
    """Rank 0 locks RUN for the life of ``stack`` and claims it (train/run_dir.py), checking a resumed
    run's config; every rank gets the same run facts, or raises the same error."""
    info, err = None, None
    if distributed.is_main():
        try:
            claim = stack.enter_context(rundir.claim(run_dir, resume=resume, force=force,
                                                     data_dir=data_dir or cfg.data.path or None))
            probe = copy.deepcopy(cfg)
            probe.data.path = str(data_location(cfg.data, run_dir, data_dir))  # as config.toml records it
            changes = rundir.check_resume_config(claim, probe, allow=allow_config_change)
            info = {"run_id": claim.run_id, "checkpoint_run_id": claim.checkpoint_run_id,
                    "continuing": claim.continuing,
                    "moved_aside": str(claim.moved_aside) if claim.moved_aside else None,
                    "config_changes": changes}
        except (OpengemError, OSError) as e:
            err = e
    shared = distributed.gather_objects((info, None if err is None else str(err)))[0]
    if err is not None:
        raise err
    if shared[1] is not None:
        raise TrainError(shared[1])
    return shared[0]


def train(cfg: RunConfig, run_dir: str | Path, data_dir: str | Path | None = None, *, resume: bool = False,
          force: bool = False, allow_config_change: bool = False,
          timer: StartupTimer | None = None) -> dict[str, Any]:
    """Train per ``cfg`` and write the run folder; returns the summary also written to train_summary.json.

    The folder is locked for the life of the run and must not hold another run (train/run_dir.py):
    ``resume`` continues the run in it from its newest complete checkpoint (model, optimizers, lr
    schedule, loader position, RNG, counters), or starts afresh when there is none, refusing settings
    that change what is computed unless ``allow_config_change`` (then recorded); ``force`` moves a
    previous run aside first. SIGINT/SIGTERM save a checkpoint and raise :class:`RunInterrupted`. Under
    torchrun every rank calls this; rank 0 locks and writes the run folder's files.
    """
    with Trainer(cfg, run_dir, data_dir, resume=resume, force=force, allow_config_change=allow_config_change,
                 timer=timer) as trainer:
        try:
            return trainer.fit()
        except OpengemError as e:
            if not isinstance(e, RunInterrupted):  # the run's own log says why it stopped (opengem report)
                trainer.log.write({"kind": "error", "step": trainer.step, "error": str(e)}, trainer.step)
            raise


def check_kernel_device(cfg: RunConfig, device: torch.device) -> None:
    """``model.gem.kernel = "triton"`` on a run that trains on the CPU is a config error, said before the run
    folder is claimed (it failed at the first forward, as an internal error, leaving a half-made run)."""
    gem = getattr(cfg.model, "gem", None)
    if (cfg.model.name == "gem" and getattr(gem, "kernel", None) == "triton" and device.type != "cuda"
            and not triton_interpreting()):
        raise ConfigError("model.gem.kernel = 'triton': the Triton kernels run on a CUDA device, and this "
                          "run trains on the CPU; use 'fused' (the default) there (TRITON_INTERPRET=1 runs "
                          "them in Triton's CPU interpreter: slow, for tests)")


def ckpt_float(res: dict[str, Any], metric: str, key: str) -> float | None:
    """The early-stopping score of ``res`` as JSON can hold it (NaN -> None)."""
    v = early_stop_score(res, metric, key)
    return None if v != v else v


def label_base_rates(ds: Dataset, spec: str) -> tuple[torch.Tensor, list[str]]:
    """Observed rate of each task's label per surface over the partitions ``spec`` selects, [S, T] (NaN
    where a surface has no observed label of a task), and the files that could not be read (skipped here:
    the loader names their problem when training reaches them, online training quarantines them). Streams
    only the surface and label columns."""
    sch = ds.schema
    S, T = len(sch.surfaces), len(sch.tasks)
    sums, counts = np.zeros((S, T)), np.zeros((S, T))
    cols = [sch.surface_column, *(t.label_column for t in sch.tasks)]
    unreadable: list[str] = []
    for path in ds.files(spec):
        s_file, c_file = np.zeros((S, T)), np.zeros((S, T))
        try:
            for rb in pq.ParquetFile(path).iter_batches(columns=cols, batch_size=65536):
                surface = rb.column(0).to_numpy(zero_copy_only=False).astype(np.int64)
                if surface.size and (surface.min() < 0 or surface.max() >= S):
                    raise TrainError(f"{path}: column {sch.surface_column!r} has values outside [0, {S})")
                for j in range(T):
                    y = rb.column(1 + j).to_numpy(zero_copy_only=False).astype(np.float64)
                    seen = ~np.isnan(y)
                    s_file[:, j] += np.bincount(surface[seen], weights=y[seen], minlength=S)
                    c_file[:, j] += np.bincount(surface[seen], minlength=S)
        except (pa.ArrowException, OSError, KeyError) as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            unreadable.append(f"{path}: {first}")
            continue
        sums += s_file
        counts += c_file
    with np.errstate(invalid="ignore", divide="ignore"):
        rates = torch.from_numpy(np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)).float()
    return rates, unreadable


def peak_device_mem_mb(device: torch.device) -> float | None:
    """Peak CUDA memory allocated by this process (None on CPU, where peak_rss_mb is the number)."""
    if device.type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)


def peak_rss_mb() -> float:
    """Peak resident memory of this process (Linux: ru_maxrss is in KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
