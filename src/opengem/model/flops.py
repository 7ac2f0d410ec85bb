"""Forward FLOPs per example: analytic formulas and a measured check.

Scaling plots and equal-compute comparisons use GFLOP/example, so every model states its own forward
FLOPs analytically (``flops_per_example``) and tests hold that number to what
``torch.utils.flop_counter.FlopCounterMode`` measures on the real module. Conventions:

- a matmul of [m, k] x [k, n] costs 2·m·k·n; biases, activations, norms, pooling sums and other
  elementwise ops are ignored (FlopCounterMode ignores them too);
- embedding lookups (EmbeddingBag / Embedding gathers) count **0 FLOPs**: they move memory, they do
  no arithmetic, and FlopCounterMode does not count them either.

Measure with :func:`flop_counter`, not a bare ``FlopCounterMode()``: it adds the formulas that
``opengem.ops`` declares for kernels torch does not count (the CPU flash-attention kernel), scoped to that
one counter; nothing changes torch's global FLOP registry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch.utils.flop_counter import FlopCounterMode

from opengem.ops import flop_formulas

if TYPE_CHECKING:
    from opengem.data.batch import Batch


def linear_flops(in_dim: int, out_dim: int, rows: int = 1) -> int:
    """One dense layer applied to ``rows`` vectors."""
    return 2 * in_dim * out_dim * rows


def mlp_flops(dims: Sequence[int], rows: int = 1) -> int:
    """An MLP with layer widths ``dims`` (input first, output last) applied to ``rows`` vectors."""
    return sum(linear_flops(a, b, rows) for a, b in zip(dims[:-1], dims[1:]))


def attention_flops(q_len: int, kv_len: int, dim: int, heads: int = 1) -> int:
    """Scores (Q·Kᵀ) plus weighted values (P·V) for ``heads`` heads of width ``dim`` each.

    Projections are not included: count them with :func:`linear_flops`.
    """
    return heads * (2 * q_len * kv_len * dim + 2 * q_len * kv_len * dim)


def model_flops(model: torch.nn.Module, seq_len: int | None = None) -> int:
    """The model's own analytic forward FLOPs per example at full sequence length ``seq_len``."""
    fn = getattr(model, "flops_per_example", None)
    if fn is None:
        raise TypeError(
            f"{type(model).__name__} has no flops_per_example(seq_len); every opengem model needs one"
        )
    return int(fn(seq_len))


def flop_counter(display: bool = False) -> FlopCounterMode:
    """FlopCounterMode that also counts opengem's ops on every backend (their formulas, this counter only)."""
    return FlopCounterMode(display=display, custom_mapping=flop_formulas())


def measured_flops(model: torch.nn.Module, batch: Batch) -> float:
    """Forward FLOPs per example as counted by :func:`flop_counter` on ``batch`` (no autograd)."""
    with torch.no_grad(), flop_counter() as counter:
        model(batch)
    return counter.get_total_flops() / max(batch.batch_size, 1)
