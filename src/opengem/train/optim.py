"""Two optimizers, because the two kinds of parameters want different ones.

Embedding tables get a *fused* sparse optimizer (row-wise Adagrad by default): TorchRec applies it
inside the backward pass to the rows a batch touched, so huge tables never materialise a dense gradient.
It must be attached with ``apply_optimizer_in_backward`` *before* DistributedModelParallel wraps the
model; DMP then builds the fused kernels and exposes them as ``model.fused_optimizer``.
Everything else (dense) gets AdamW with linear warm-up and optional cosine decay, and gradient clipping.

Regularising the tables: the fused CPU kernels accept but ignore ``weight_decay`` (rows come out the same
with and without it, torchrec 1.8 / fbgemm-gpu-cpu 1.8), so :class:`EmbeddingL2` adds an L2 term on the
embeddings a batch looked up to the loss instead; its gradient reaches exactly the touched rows.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.optim import SGD as RecSGD
from torchrec.optim import Adagrad, RowWiseAdagrad, apply_optimizer_in_backward
from torchrec.optim.optimizers import in_backward_optimizer_filter

from opengem.model.embedding import EmbeddedFeatures, FeatureEmbedding
from opengem.train.config import TrainConfig

SPARSE_CLASSES: dict[str, type[torch.optim.Optimizer]] = {
    "rowwise_adagrad": RowWiseAdagrad,
    "adagrad": Adagrad,
    "sgd": RecSGD,
}


def embedding_modules(model: nn.Module) -> list[nn.Module]:
    """Every TorchRec embedding collection in the model (the modules DMP shards)."""
    return [m for m in model.modules() if isinstance(m, (EmbeddingBagCollection, EmbeddingCollection))]


def apply_sparse_optimizer(model: nn.Module, cfg: TrainConfig,
                           lr_scale: dict[int, float] | None = None) -> int:
    """Attach the fused sparse optimizer to every embedding table; returns the number of tables.

    ``lr_scale``: ``id(parameter)`` -> multiplier of ``sparse_lr`` for tables shared from another model
    (a vertical model's copy of FM tables, at a lower rate or frozen at 0); the rest train at ``sparse_lr``.
    """
    scale = lr_scale or {}
    groups: dict[float, list[nn.Parameter]] = {}
    for m in embedding_modules(model):
        for p in m.parameters():
            groups.setdefault(scale.get(id(p), 1.0), []).append(p)
    cls = SPARSE_CLASSES[cfg.sparse_optimizer]
    for s, params in sorted(groups.items(), key=lambda kv: kv[0] != 1.0):  # the model's own tables first
        kwargs: dict[str, float] = {"lr": cfg.sparse_lr * s}
        if cfg.sparse_optimizer != "sgd":
            kwargs["eps"] = cfg.sparse_eps
        # a frozen table still needs an in-backward optimizer (DMP fuses every table): one with lr 0
        apply_optimizer_in_backward(cls if kwargs["lr"] > 0 else RowWiseAdagrad, params, kwargs)
    return sum(len(v) for v in groups.values())


def dense_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """Parameters not handled by a fused in-backward optimizer."""
    return {n: p for n, p in in_backward_optimizer_filter(model.named_parameters()) if p.requires_grad}


def build_dense_optimizer(params: dict[str, nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; biases and norm weights (1-D) are not decayed."""
    decay = [p for p in params.values() if p.ndim >= 2]
    no_decay = [p for p in params.values() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    if not groups:  # a model with only embedding tables still needs an optimizer object to step
        groups = [{"params": [nn.Parameter(torch.zeros(1))], "weight_decay": 0.0}]
    fused = can_fuse_adamw([p for g in groups for p in g["params"]])
    return torch.optim.AdamW(groups, lr=cfg.lr, fused=fused)


FUSED_ADAMW_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def can_fuse_adamw(params: list[torch.Tensor]) -> bool | None:
    """True when PyTorch's fused AdamW kernel can step these parameters: plain tensors (not FSDP's DTensors)
    of one CPU or CUDA device in a float dtype; otherwise None (PyTorch's default implementation).

    Why: on CPU the default AdamW loops over the parameters with ~10 elementwise ops each (sqrt, div, lerp,
    addcdiv...), memory-bound passes over every weight; the fused kernel does one. Measured on 9.3M
    parameters, one thread: 44.7 ms -> 9.6 ms per step, results equal to 2.4e-7 after five steps
    (``tests/test_optim_fused.py``)."""
    if not params:
        return None
    devices = {p.device for p in params}
    plain = all(type(p) in (torch.Tensor, nn.Parameter) for p in params)
    ok = (plain and len(devices) == 1 and next(iter(devices)).type in ("cpu", "cuda")
          and all(p.dtype in FUSED_ADAMW_DTYPES for p in params))
    return True if ok else None


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of the base lr at ``step`` (0-based): linear warm-up, then constant or cosine."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.lr_decay == "cosine" and cfg.steps > cfg.warmup_steps:
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return 1.0


def build_scheduler(opt: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg))


class Optimizers(NamedTuple):
    """What a training step and a checkpoint need, built one way for the trainer, online training and
    the benchmarks: the dense parameters (those no fused optimizer owns), AdamW on them, its schedule,
    and TorchRec's fused sparse optimizer (None when the model has no sharded tables)."""

    dense: list[nn.Parameter]
    dense_opt: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    sparse: Any


def build_optimizers(model: nn.Module, cfg: TrainConfig, lr_scale: dict[int, float] | None = None
                     ) -> Optimizers:
    """``lr_scale``: ``id(parameter)`` -> multiplier of ``lr`` (0 = frozen): such parameters get their own
    AdamW group without weight decay (parameters shared from another model). Identity holds where
    ``parallelize`` keeps dense parameters as they are (one process, no FSDP)."""
    dense = dense_parameters(model)
    scale = lr_scale or {}
    own = {n: p for n, p in dense.items() if scale.get(id(p), 1.0) == 1.0}
    opt = build_dense_optimizer(own, cfg)
    shared: dict[float, list[nn.Parameter]] = {}
    for p in dense.values():
        if scale.get(id(p), 1.0) != 1.0:
            shared.setdefault(scale[id(p)], []).append(p)
    for s, params in shared.items():
        if s == 0.0:
            for p in params:
                p.requires_grad_(False)
        else:
            opt.add_param_group({"params": params, "lr": cfg.lr * s, "weight_decay": 0.0})
    fused = getattr(model, "fused_optimizer", None)
    live = [p for p in dense.values() if p.requires_grad]
    return Optimizers(live, opt, build_scheduler(opt, cfg), fused)


def clip_dense_gradients(params: list[nn.Parameter], max_norm: float) -> float:
    """Clip the global norm of dense gradients; returns the norm before clipping (0 if none)."""
    grads = [p for p in params if p.grad is not None]
    if not grads:
        return 0.0
    if max_norm > 0:
        # foreach on every device: torch picks it only on GPUs, and the per-tensor loop of the default costs a
        # study model of ~90 small tensors 0.6 ms a step on CPU against 0.44 (the same norms, bit for bit)
        return float(torch.nn.utils.clip_grad_norm_(grads, max_norm, foreach=True))
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in grads])))


class EmbeddingL2:
    """L2 on the embedding rows a batch touches, as a loss term: ``weight`` times the batch mean of the
    summed squared pooled embeddings of every sparse feature (a row looked up by k examples is pulled
    towards 0 k times; rows no example touched are left alone, as a fused optimizer's lazy decay would).

    A forward hook on each :class:`FeatureEmbedding` collects the term while the model trains with
    gradients on; :meth:`take` hands it to the step (None when the forward looked nothing up). Sequence
    lookups are not included: they are not pooled per feature.
    """

    def __init__(self, model: nn.Module, weight: float) -> None:
        self.weight = weight
        self._terms: list[torch.Tensor] = []
        self._handles = [m.register_forward_hook(self._hook) for m in model.modules()
                         if isinstance(m, FeatureEmbedding)]

    @property
    def attached(self) -> int:
        """How many embedding modules are hooked (0: the model has none; the term is never added)."""
        return len(self._handles)

    def _hook(self, module: nn.Module, args: Any, out: EmbeddedFeatures) -> None:
        if not (module.training and torch.is_grad_enabled()) or not out.pooled:
            return
        sq = sum(v.float().pow(2).sum() for v in out.pooled.values())
        batch = next(iter(out.pooled.values())).shape[0]
        self._terms.append(self.weight * sq / max(batch, 1))

    def take(self) -> torch.Tensor | None:
        """The term of the forward passes since the last call (summed), and forget them."""
        terms, self._terms = self._terms, []
        return torch.stack(terms).sum() if terms else None

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
