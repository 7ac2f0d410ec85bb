"""RunConfig: everything one training run reads, as one TOML recipe (configs/*.toml) plus overrides.

A run writes its resolved RunConfig to RUN/config.toml, so ``opengem evaluate --run RUN`` rebuilds the
exact model without the original recipe or command line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opengem.config import ConfigError, load_config
from opengem.model.registry import ModelConfig

DEVICES = ("auto", "cpu", "cuda")
SPARSE_OPTIMIZERS = ("rowwise_adagrad", "adagrad", "sgd")  # the fused optimizers that run on CPU (DESIGN §9)
LR_DECAYS = ("none", "cosine")


@dataclass
class DataConfig:
    path: str = ""  # dataset folder; "" = the embedded default, simulated into RUN/data with [data.sim]
    sim: dict[str, Any] = field(default_factory=dict)  # SimConfig overrides (opengem.data.sim_config)
    train: str = "@all_but_last"  # partition spec (data.dataset); time-ordered: evaluate on the future
    eval: str = "@last"
    batch_size: int = 256
    eval_batch_size: int = 0  # 0 = batch_size
    num_workers: int = 0
    on_error: str = ""  # "" = the schema's policy; "error" | "skip" override it for the loader
    shuffle: bool = True  # shuffle row groups (units) each epoch


@dataclass
class TrainConfig:
    steps: int = 0  # > 0: train this many steps (cycling epochs); 0: train `epochs` epochs
    epochs: int = 1
    lr: float = 1e-3  # dense AdamW
    warmup_steps: int = 100
    lr_decay: str = "none"  # none | cosine (to min_lr_ratio * lr at the last step; needs steps > 0)
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0  # max global norm of dense gradients; 0 = off
    sparse_optimizer: str = "rowwise_adagrad"  # fused in backward: rowwise_adagrad | adagrad | sgd
    sparse_lr: float = 0.05
    sparse_eps: float = 1e-8
    log_every: int = 20
    eval_every: int = 0  # steps; 0 = only at the end
    eval_max_batches: int = 0  # cap on batches per periodic evaluation; 0 = all (final eval is always all)
    checkpoint_every: int = 0  # steps; 0 = only the final checkpoint
    final_eval: bool = True  # evaluate on data.eval after training (-> metrics.jsonl)
    seed: int = 0
    device: str = "auto"  # auto (CUDA when available) | cpu | cuda
    threads: int = 0  # CPU intra-op threads for this run (0 = torch's default); 1 is fastest for tiny models
    progress: bool = True  # tqdm bar


@dataclass
class RunConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> None:
        """Fail on a bad value here, naming the key, rather than as a shape error deep in PyTorch."""
        t, d = self.train, self.data

        def need(ok: bool, key: str, msg: str, value: Any) -> None:
            if not ok:
                raise ConfigError(f"{key}: {msg} (got {value!r})")

        need(t.device in DEVICES, "train.device", f"must be one of {', '.join(DEVICES)}", t.device)
        need(t.sparse_optimizer in SPARSE_OPTIMIZERS, "train.sparse_optimizer",
             f"must be one of {', '.join(SPARSE_OPTIMIZERS)}", t.sparse_optimizer)
        need(t.lr_decay in LR_DECAYS, "train.lr_decay", f"must be one of {', '.join(LR_DECAYS)}", t.lr_decay)
        need(t.lr_decay == "none" or t.steps > 0, "train.lr_decay", "cosine decay needs train.steps > 0",
             t.lr_decay)
        need(t.steps >= 0, "train.steps", "must be >= 0", t.steps)
        need(t.steps > 0 or t.epochs > 0, "train.epochs", "must be > 0 when train.steps = 0", t.epochs)
        for k in ("lr", "sparse_lr"):
            need(getattr(t, k) > 0, f"train.{k}", "must be > 0", getattr(t, k))
        for k in ("warmup_steps", "weight_decay", "grad_clip", "eval_every", "eval_max_batches",
                  "checkpoint_every"):
            need(getattr(t, k) >= 0, f"train.{k}", "must be >= 0", getattr(t, k))
        need(t.threads >= 0, "train.threads", "must be >= 0", t.threads)
        need(t.log_every > 0, "train.log_every", "must be > 0", t.log_every)
        need(0 <= t.min_lr_ratio <= 1, "train.min_lr_ratio", "must be in [0, 1]", t.min_lr_ratio)
        need(d.batch_size > 0, "data.batch_size", "must be > 0", d.batch_size)
        need(d.eval_batch_size >= 0, "data.eval_batch_size", "must be >= 0", d.eval_batch_size)
        need(d.num_workers >= 0, "data.num_workers", "must be >= 0", d.num_workers)
        need(d.on_error in ("", "error", "skip"), "data.on_error", 'must be "", "error" or "skip"',
             d.on_error)


def load_run_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    cfg = load_config(RunConfig, path, overrides)
    cfg.validate()
    return cfg
