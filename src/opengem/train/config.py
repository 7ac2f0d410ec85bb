"""RunConfig: everything one training run reads, as one TOML recipe (configs/*.toml) plus overrides.

A run writes its resolved RunConfig to RUN/config.toml, so ``opengem evaluate --run RUN`` rebuilds the
exact model without the original recipe or command line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opengem.config import ConfigError, load_config, require_finite
from opengem.data.splits import spec_tokens
from opengem.errors import DatasetError
from opengem.model.registry import MODEL_NAMES, ModelConfig
from opengem.ops.cpu_autocast import THIN_CHOICES  # train.cpu_bf16_thin
from opengem.train.early_stop import EarlyStopConfig

DEVICES = ("auto", "cpu", "cuda")
SPARSE_OPTIMIZERS = ("rowwise_adagrad", "adagrad", "sgd")  # the fused optimizers that run on CPU (DESIGN §9)
LR_DECAYS = ("none", "cosine")
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")  # train.compile_backend (opengem.train.compile)
CPU_LINEAR_CHOICES = ("auto", "pytorch", "onednn")  # train.cpu_linear (opengem.train.cpu_linear)
AC_MODES = ("none", "layer")  # train.activation_checkpointing (opengem.train.memory)
PRECISIONS = ("fp32", "bf16")  # train.precision
FP8_MODES = ("off", "e4m3", "e5m2")  # train.fp8_saved_activations
SHARDINGS = ("auto", "table_wise", "row_wise", "column_wise")  # train.sharding (parallelize.py)
PIPELINES = ("none", "sparse_dist")  # train.pipeline (opengem.train.pipeline)


@dataclass
class DataConfig:
    path: str = ""  # dataset folder; "" = the embedded default, simulated into RUN/data with [data.sim]
    sim: dict[str, Any] = field(default_factory=dict)  # SimConfig overrides (opengem.data.sim_config)
    # Partition specs (opengem.data.splits): the train split and the valid split of a converted dataset,
    # or every day but the last and the last day ("evaluate on the future") of a simulated one.
    train: str = "@train"
    eval: str = "@valid"
    batch_size: int = 256
    eval_batch_size: int = 0  # 0 = batch_size
    num_workers: int = 0
    on_error: str = ""  # "" = the schema's policy; "error" | "skip" override it for the loader
    shuffle: bool = True  # shuffle row groups (units) each epoch
    # Training only: >= 2 interleaves the rows of this many row groups per loader stream. A row group is
    # a contiguous slice of time: read one after another, they make consecutive batches time-correlated;
    # 0 (or 1) = one row group after another; -1 = a window per partition (a day of day=NNN folders: with
    # data.shuffle = false, days in order, each mixed whole). Resuming needs the same value (data.loader).
    shuffle_window: int = 0
    # Training batches each rank reads and drops before the first step of a fresh run (never on resume):
    # with data.shuffle = false and train.steps fixed, the run then ends on the newest rows of its split
    # instead of stopping short of them (the iso-FLOP study's train_window = "latest_rows").
    skip_batches: int = 0


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
    eval_max_batches: int = 0  # cap per periodic eval, rows spread over the day; 0 = all (final eval: all)
    checkpoint_every: int = 0  # steps; 0 = only the final checkpoint
    final_eval: bool = True  # evaluate on data.eval after training (-> metrics.jsonl)
    seed: int = 0
    device: str = "auto"  # auto (CUDA when available) | cpu | cuda
    threads: int = 0  # CPU intra-op threads for this run (0 = torch's default); 1 is fastest for tiny models
    progress: bool = True  # tqdm bar
    # --- distribution (opengem.train.parallelize / distributed)
    # embedding tables: auto (planner picks table/row-wise) | table_wise | row_wise | column_wise
    sharding: str = "auto"
    sparse_replicas: int = 1  # > 1: TorchRec 2-D layout (DMPCollection), tables replicated N times; GPU only
    dp_replicate: int = 1  # dense HSDP: replica groups; 1 = plain FSDP over all ranks
    dp_shard: int = -1  # dense HSDP: ranks per shard group; -1 = world / dp_replicate
    fsdp_mixed_precision: str = "none"  # none | bf16 (FSDP2 MixedPrecisionPolicy: bf16 params, fp32 reduce)
    dist_timeout_s: float = 600.0  # collectives fail after this long (a dead rank never hangs the others)
    # --- checkpoints (opengem.train.checkpoint)
    keep_checkpoints: int = 3  # periodic checkpoints kept (newest); 0 = keep all
    # --- compile and memory savers (opengem.train.compile, opengem.train.memory)
    compile: bool = False  # torch.compile the dense blocks (not the embedding tables); pads sequences
    compile_backend: str = "inductor"  # inductor | aot_eager | eager (the last two: debugging, tests)
    compile_cache_dir: str = ""  # persistent Inductor cache; "" = ~/.cache/opengem/inductor (run-independent)
    activation_checkpointing: str = "none"  # none | layer (each InterFormer/Wukong/encoder layer)
    precision: str = "fp32"  # fp32 | bf16 (autocast; weights and loss stay fp32)
    # under CPU bf16 autocast, GEM's thin d-wide products (sequence side, FMB): fp32 (kept out of autocast:
    # AMX hosts ran them slower in bf16) | bf16 (left to autocast: GEM-small's bf16 step 1.08x as fast on an
    # AVX-512-bf16 host without AMX, 1.13x its fp32 step)
    cpu_bf16_thin: str = "fp32"  # (opengem.ops.cpu_autocast)
    # fp32 nn.Linear on CPU: auto (oneDNN where a probe finds it >= 1.3x PyTorch's BLAS) | pytorch | onednn
    cpu_linear: str = "auto"  # (opengem.train.cpu_linear)
    # none | sparse_dist: TorchRec's TrainPipelineSparseDist in fit() (the next batch's device copy and pooled
    # embedding input all-to-all start before this batch's forward; opengem.train.pipeline)
    pipeline: str = "none"
    fp8_saved_activations: str = "off"  # off | e4m3 | e5m2: saved-for-backward tensors stored as float8
    fp8_min_numel: int = 4096  # smaller saved tensors stay as they are
    # --- continuous training (opengem train --online; opengem.train.online)
    online_poll_s: float = 5.0  # how often to look for a new partition when all seen ones are trained
    online_max_idle_s: float = 60.0  # stop after this long without a new partition (0 = stop at once)
    online_until: str = ""  # stop after training this partition (e.g. "day=013"); "" = no end partition
    online_first: str = ""  # first partition to consume ("" = the oldest)
    # --- small-data knobs (issue 11): regularisation, output-bias prior, early stopping
    # L2 on the embedding rows a batch looks up: adds embedding_l2 * mean over rows of the summed squared
    # pooled embeddings to the loss (opengem.train.optim.EmbeddingL2). The fused CPU optimizers ignore
    # their weight_decay argument (measured, torchrec 1.8 / fbgemm-gpu-cpu 1.8), hence a loss term.
    embedding_l2: float = 0.0
    # start each (surface, task) output bias at the logit of its base rate in data.train (one streamed
    # pass over the surface and label columns before training); false = zeros (p = 0.5), as before
    init_output_bias: bool = True
    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig)  # patience 0 = off


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

        require_finite((t, "train."))  # NaN passes every range check below as false
        # before any data is simulated or read (a typo in model.name was said after simulating the stream)
        if self.model.name not in MODEL_NAMES:
            raise ConfigError(f"model.name: unknown model {self.model.name!r}; choose one of "
                              f"{', '.join(MODEL_NAMES)}")
        need(t.sparse_eps > 0, "train.sparse_eps", "must be > 0", t.sparse_eps)
        need(t.dist_timeout_s <= 10**9, "train.dist_timeout_s", "must be <= 1e9 seconds", t.dist_timeout_s)
        need(t.device in DEVICES, "train.device", f"must be one of {', '.join(DEVICES)}", t.device)
        need(t.sparse_optimizer in SPARSE_OPTIMIZERS, "train.sparse_optimizer",
             f"must be one of {', '.join(SPARSE_OPTIMIZERS)}", t.sparse_optimizer)
        need(t.cpu_bf16_thin in THIN_CHOICES, "train.cpu_bf16_thin",
             f"must be one of {', '.join(THIN_CHOICES)}", t.cpu_bf16_thin)
        need(t.cpu_linear in CPU_LINEAR_CHOICES, "train.cpu_linear",
             f"must be one of {', '.join(CPU_LINEAR_CHOICES)}", t.cpu_linear)
        need(t.pipeline in PIPELINES, "train.pipeline", f"must be one of {', '.join(PIPELINES)}", t.pipeline)
        need(t.lr_decay in LR_DECAYS, "train.lr_decay", f"must be one of {', '.join(LR_DECAYS)}", t.lr_decay)
        need(t.lr_decay == "none" or t.steps > 0, "train.lr_decay", "cosine decay needs train.steps > 0",
             t.lr_decay)
        need(t.steps >= 0, "train.steps", "must be >= 0", t.steps)
        need(t.steps > 0 or t.epochs > 0, "train.epochs", "must be > 0 when train.steps = 0", t.epochs)
        for k in ("lr", "sparse_lr"):  # inf passed '> 0' and made every loss nan at step 1
            need(0 < getattr(t, k) < math.inf, f"train.{k}", "must be a finite number > 0", getattr(t, k))
        for k in ("warmup_steps", "weight_decay", "grad_clip", "eval_every", "eval_max_batches",
                  "checkpoint_every"):
            need(getattr(t, k) >= 0, f"train.{k}", "must be >= 0", getattr(t, k))
        need(t.threads >= 0, "train.threads", "must be >= 0", t.threads)
        need(t.sharding in SHARDINGS, "train.sharding", f"must be one of {', '.join(SHARDINGS)}", t.sharding)
        need(t.sparse_replicas >= 1, "train.sparse_replicas", "must be >= 1", t.sparse_replicas)
        need(t.dp_replicate >= 1, "train.dp_replicate", "must be >= 1", t.dp_replicate)
        need(t.dp_shard == -1 or t.dp_shard >= 1, "train.dp_shard", "must be -1 or >= 1", t.dp_shard)
        need(t.fsdp_mixed_precision in ("none", "bf16"), "train.fsdp_mixed_precision", "must be none or bf16",
             t.fsdp_mixed_precision)
        need(t.dist_timeout_s > 0, "train.dist_timeout_s", "must be > 0", t.dist_timeout_s)
        need(t.keep_checkpoints >= 0, "train.keep_checkpoints", "must be >= 0", t.keep_checkpoints)
        need(t.compile_backend in COMPILE_BACKENDS, "train.compile_backend",
             f"must be one of {', '.join(COMPILE_BACKENDS)}", t.compile_backend)
        need(t.activation_checkpointing in AC_MODES, "train.activation_checkpointing",
             f"must be one of {', '.join(AC_MODES)}", t.activation_checkpointing)
        need(t.precision in PRECISIONS, "train.precision", f"must be one of {', '.join(PRECISIONS)}",
             t.precision)
        need(t.fp8_saved_activations in FP8_MODES, "train.fp8_saved_activations",
             f"must be one of {', '.join(FP8_MODES)}", t.fp8_saved_activations)
        need(t.fp8_min_numel >= 0, "train.fp8_min_numel", "must be >= 0", t.fp8_min_numel)
        need(t.online_poll_s > 0, "train.online_poll_s", "must be > 0", t.online_poll_s)
        need(t.online_max_idle_s >= 0, "train.online_max_idle_s", "must be >= 0", t.online_max_idle_s)
        need(t.log_every > 0, "train.log_every", "must be > 0", t.log_every)
        need(t.embedding_l2 >= 0, "train.embedding_l2", "must be >= 0", t.embedding_l2)
        dropout = self.model.head.dropout
        need(0 <= dropout < 1, "model.head.dropout", "must be in [0, 1)", dropout)
        t.early_stop.validate()
        if t.early_stop.enabled:
            try:
                spec_tokens(t.early_stop.partition)
            except DatasetError as e:
                raise ConfigError(f"train.early_stop.partition: {e}") from None
        need(0 <= t.min_lr_ratio <= 1, "train.min_lr_ratio", "must be in [0, 1]", t.min_lr_ratio)
        need(d.batch_size > 0, "data.batch_size", "must be > 0", d.batch_size)
        need(d.eval_batch_size >= 0, "data.eval_batch_size", "must be >= 0", d.eval_batch_size)
        need(d.num_workers >= 0, "data.num_workers", "must be >= 0", d.num_workers)
        need(d.shuffle_window >= -1, "data.shuffle_window", "must be >= 0, or -1 (a window per partition)",
             d.shuffle_window)
        need(d.skip_batches >= 0, "data.skip_batches", "must be >= 0", d.skip_batches)
        need(d.on_error in ("", "error", "skip"), "data.on_error", 'must be "", "error" or "skip"',
             d.on_error)
        for k in ("train", "eval"):
            try:
                spec_tokens(getattr(d, k))
            except DatasetError as e:
                raise ConfigError(f"data.{k}: {e}") from None


def load_run_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    cfg = load_config(RunConfig, path, overrides)
    cfg.validate()
    return cfg
