"""Multi-surface, multi-task head and the masked loss every opengem model trains with.

One trunk is shared by all surfaces (so knowledge transfers between them); each surface gets a small
residual adapter and its own logit per task (so each surface is optimised for its own objective). The
per-surface weights are stacked [S, ...] (names and shapes are checkpoint format) and applied by
:func:`opengem.ops.surface_head.surface_head`: one matrix product per layer for the whole batch, each
example keeping its own surface's result (it used to gather a weight copy per example: 5-6x slower).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from opengem.config import ConfigError
from opengem.data.schema import FeatureSchema
from opengem.model.flops import mlp_flops
from opengem.ops.kernel import Kernel
from opengem.ops.surface_head import discarded_flops_per_example, surface_head


@dataclass
class HeadConfig:
    hidden: list[int] = field(default_factory=lambda: [64])  # shared trunk MLP
    adapter_dim: int = 16  # per-surface residual adapter bottleneck (0 = off)
    # Dropout on the head's input and on the trunk's output (training only; 0 = off). Small click logs
    # overfit within a few epochs: this is the cheapest brake that every model shares.
    dropout: float = 0.0
    # Request context straight into every (surface, task) logit: "none"; "time" = the derived clock inputs
    # (hour-of-day / day-of-week sin and cos); "dense" = every dense input. A zero-initialised linear term
    # per surface and task, ``logit_st += c . V_st``. Why: surfaces follow daily cycles of their own (a
    # phase per surface), which is a surface x context product; the trunk mixes the surfaces, and at the
    # study's sizes no family learns a small surface's cycle (benchmarks/results/2026-12-02-s14/context/).
    context: str = "none"


def mlp(dims: Sequence[int], final_activation: bool = True) -> nn.Sequential:
    """Linear+ReLU stack with widths ``dims`` (input first); the last ReLU is optional."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        layers.append(nn.Linear(a, b))
        if final_activation or i < len(dims) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


HEAD_CONTEXTS = ("none", "time", "dense")


def context_columns(schema: FeatureSchema, context: str) -> slice:
    """Columns of ``Batch.dense`` (``schema.dense_input_names``: dense features, then the derived time
    features) that feed the head's context term: one contiguous range, so taking them is a view."""
    if context not in HEAD_CONTEXTS:
        raise ConfigError(f"head.context: {context!r} is not one of {', '.join(HEAD_CONTEXTS)}")
    n = schema.num_dense_inputs
    if context == "dense":
        return slice(0, n)
    if context == "time":
        return slice(n - len(schema.time_feature_names), n)
    return slice(0, 0)


def head_context(dense: torch.Tensor | None, columns: slice) -> torch.Tensor | None:
    """The head's context [B, C] from the model's dense inputs [B, Dd] (None when the head has none)."""
    if columns.stop <= columns.start or dense is None:
        return None
    return dense[:, columns]


class MultiSurfaceHead(nn.Module):
    def __init__(self, in_dim: int, num_surfaces: int, num_tasks: int, cfg: HeadConfig,
                 context_dim: int = 0) -> None:
        """``context_dim``: width of the context the model passes to :meth:`forward` (0 = no context term;
        a model sizes it with :func:`context_columns`)."""
        super().__init__()
        if num_surfaces <= 0 or num_tasks <= 0:
            raise ValueError(f"MultiSurfaceHead needs >= 1 surface and task, got {num_surfaces}, {num_tasks}")
        if cfg.adapter_dim < 0 or any(h <= 0 for h in cfg.hidden):
            raise ValueError(f"head: hidden widths and adapter_dim must be positive, got {cfg}")
        if not 0.0 <= cfg.dropout < 1.0:
            raise ConfigError(f"model.head.dropout: must be in [0, 1) (got {cfg.dropout})")
        self.cfg = cfg
        self.in_dim = in_dim
        self.num_surfaces = num_surfaces
        self.num_tasks = num_tasks
        self._trunk_dims = [in_dim, *cfg.hidden]
        self.trunk = mlp(self._trunk_dims) if cfg.hidden else nn.Identity()
        # outside ``trunk`` so that parameter names (and old checkpoints) do not depend on it
        self.dropout = nn.Dropout(cfg.dropout) if cfg.dropout else nn.Identity()
        H = self.out_dim = self._trunk_dims[-1]
        a = cfg.adapter_dim
        if a:
            self.adapter_down = nn.Parameter(torch.randn(num_surfaces, H, a) / math.sqrt(H))
            self.adapter_down_bias = nn.Parameter(torch.zeros(num_surfaces, a))
            self.adapter_up = nn.Parameter(torch.randn(num_surfaces, a, H) * (0.1 / math.sqrt(a)))
        self.out_weight = nn.Parameter(torch.randn(num_surfaces, H, num_tasks) / math.sqrt(H))
        self.out_bias = nn.Parameter(torch.zeros(num_surfaces, num_tasks))
        self.context_dim = context_dim
        if context_dim:  # zero: the model starts as it would without the term
            self.context_weight = nn.Parameter(torch.zeros(num_surfaces, context_dim, num_tasks))
        # ops kernel (opengem.ops.surface_head): fused = one product per layer for the whole batch;
        # pytorch = the per-example reference. Not a parameter: GEM's model.gem.kernel sets it (use_kernel).
        self.kernel: Kernel | str = Kernel.FUSED

    def forward(self, x: torch.Tensor, surface: torch.Tensor, context: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [B, T] of each example's own surface, shared trunk [B, H]); ``context`` [B, context_dim]
        when the head has a context term (ignored otherwise)."""
        if x.dim() != 2 or x.shape[1] != self.in_dim:
            raise ValueError(f"head input has shape {tuple(x.shape)}, expected [B, {self.in_dim}]")
        if self.context_dim and (context is None or context.shape != (x.shape[0], self.context_dim)):
            got = None if context is None else tuple(context.shape)
            raise ValueError(f"head context has shape {got}, expected [{x.shape[0]}, {self.context_dim}]")
        if not torch.compiler.is_compiling() and surface.numel():
            lo, hi = torch.stack(torch.aminmax(surface)).tolist()  # one reduction, one host sync
            if lo < 0 or hi >= self.num_surfaces:
                raise ValueError(
                    f"batch.surface has values in [{lo}, {hi}], expected [0, {self.num_surfaces})")
        trunk = self.trunk(self.dropout(x))
        adapter = (self.adapter_down, self.adapter_down_bias, self.adapter_up) if self.cfg.adapter_dim else ()
        logits = surface_head(self.dropout(trunk), surface, self.out_weight, self.out_bias, *adapter,
                              kernel=self.kernel)
        if self.context_dim:
            logits = logits + self._context_logits(context.to(logits.dtype), surface)  # type: ignore[union-attr]
        return logits, trunk

    def _context_logits(self, context: torch.Tensor, surface: torch.Tensor) -> torch.Tensor:
        """c . V_st for each example's own surface: every surface's term in one product [B, C] x [C, S*T]
        (C and T are a handful), then each example's own row."""
        S, C, T = self.context_weight.shape
        every = (context @ self.context_weight.permute(1, 0, 2).reshape(C, S * T)).view(-1, S, T)
        return every.gather(1, surface.long().view(-1, 1, 1).expand(-1, 1, T)).squeeze(1)

    @torch.no_grad()
    def init_output_bias(self, base_rates: torch.Tensor) -> None:
        """Start every (surface, task) logit at the logit of its base rate ``base_rates`` [S, T] (NaN =
        unknown: left as it is). At p = 0.5 on 1 % click data the first steps only learn the base rate,
        and a surface with few rows may never get there; a bias at the prior starts training where a
        constant predictor ends."""
        if base_rates.shape != self.out_bias.shape:
            raise ValueError(f"init_output_bias: base rates have shape {tuple(base_rates.shape)}, "
                             f"expected {tuple(self.out_bias.shape)} [surfaces, tasks]")
        p = base_rates.to(self.out_bias).clamp(1e-6, 1 - 1e-6)
        known = ~torch.isnan(base_rates.to(self.out_bias.device))
        self.out_bias.copy_(torch.where(known, torch.logit(p), self.out_bias))

    def flops_per_example(self) -> int:
        H, a, T = self.out_dim, self.cfg.adapter_dim, self.num_tasks
        return mlp_flops(self._trunk_dims) + 2 * (2 * H * a) + 2 * H * T + 2 * self.context_dim * T

    def discarded_flops_per_example(self) -> int:
        """FLOPs the head computes for the other surfaces and throws away (counted by FlopCounterMode, not
        by :meth:`flops_per_example`, the model FLOPs MFU divides); the reference kernel discards none."""
        context = 2 * self.context_dim * self.num_tasks * (self.num_surfaces - 1)  # every surface's term
        if self.kernel == Kernel.PYTORCH:
            return context
        return context + discarded_flops_per_example(self.out_dim, self.cfg.adapter_dim, self.num_tasks,
                                                     self.num_surfaces)


def masked_bce(
    logits: torch.Tensor,
    labels: torch.Tensor,
    mask: torch.Tensor,
    task_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """BCE-with-logits summed over observed labels (times their task weight) / number of observed labels.

    Unobserved entries are replaced before the loss (not only multiplied by zero), so a NaN label or an
    infinite logit in an unobserved slot contributes neither loss nor gradient. A batch with no observed
    label gives 0 (with a graph), not NaN.
    """
    if logits.shape != labels.shape or logits.shape != mask.shape:
        raise ValueError(
            f"masked_bce: logits {tuple(logits.shape)}, labels {tuple(labels.shape)} and mask "
            f"{tuple(mask.shape)} must have the same shape [B, T]"
        )
    mask = mask.bool()
    safe_logits = torch.where(mask, logits, torch.zeros_like(logits))
    safe_labels = torch.where(mask, labels, torch.zeros_like(labels)).to(logits.dtype)
    loss = F.binary_cross_entropy_with_logits(safe_logits, safe_labels, reduction="none")
    w = mask.to(logits.dtype)
    if task_weights is not None:
        if task_weights.shape != (logits.shape[1],):
            raise ValueError(
                f"masked_bce: task_weights has shape {tuple(task_weights.shape)}, "
                f"expected [{logits.shape[1]}]"
            )
        w = w * task_weights.to(logits)[None, :]
    return (loss * w).sum() / mask.sum().clamp(min=1).to(logits.dtype)
