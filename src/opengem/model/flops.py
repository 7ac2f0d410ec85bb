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

from collections.abc import Iterable, Sequence
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


def executed_flops_per_example(model: torch.nn.Module, batches: Iterable[Batch]) -> float:
    """The model's analytic forward FLOPs per example at each example's real sequence length, averaged.

    Histories are jagged: an example with 9 events does 9 events' work, not ``max_len``'s, so MFU on
    ``model_flops(model)`` (full length) over-states the work done (tiny recipe: 14.7 % vs 2.3 %). Each
    example is counted as ``flops_per_example(L)`` with L its history length from the batch's jagged
    lengths; one distinct L costs one formula call. With several sequence groups the formula takes one
    length for all groups (each capped at its own max_len), so an example is counted at its longest
    group: exact for one group, an upper bound for several. Models without sequences: the full count.
    """
    per_length: dict[int, int] = {}
    total, rows = 0, 0
    for batch in batches:
        seqs = [sb.lengths.detach().to("cpu", torch.long) for sb in batch.sequences.values()]
        if not seqs:
            total += model_flops(model) * batch.batch_size
            rows += batch.batch_size
            continue
        longest = torch.stack(seqs).amax(dim=0)
        lengths, counts = torch.unique(longest, return_counts=True)
        for L, n in zip(lengths.tolist(), counts.tolist()):
            if L not in per_length:
                per_length[L] = model_flops(model, L)
            total += per_length[L] * n
            rows += n
    if rows == 0:
        raise ValueError("executed_flops_per_example: no examples in the batches")
    return total / rows


def padded_flops_per_example(model: torch.nn.Module, batches: Iterable[Batch]) -> float:
    """Forward FLOPs per example as the model runs them, padding included, averaged over ``batches``.

    A padded block works on every slot of its padded rows, real or not: GEM's sequence path costs
    ``flops(width)`` per row, where width is the batch's longest history, or with ``gem.seq_buckets`` each
    bucket's longest row, so a bucketed batch counts sum over buckets of rows x flops(bucket width). Models
    say so through ``batch_flops(batch)``; for one without it, the count at real lengths
    (:func:`executed_flops_per_example`). With one sequence group it is >= that count, and the difference
    is padding, the work that length buckets remove (with several, that count is itself an upper bound).
    MFU on it tells how busy the machine was; MFU on real lengths, how much of that was the model's own
    work.
    """
    batches = list(batches)
    fn = getattr(model, "batch_flops", None)
    if fn is None:
        return executed_flops_per_example(model, batches)
    rows = sum(b.batch_size for b in batches)
    if rows == 0:
        raise ValueError("padded_flops_per_example: no examples in the batches")
    return sum(int(fn(b)) for b in batches) / rows


def flop_counter(display: bool = False) -> FlopCounterMode:
    """FlopCounterMode that also counts opengem's ops on every backend (their formulas, this counter only)."""
    return FlopCounterMode(display=display, custom_mapping=flop_formulas())


def discarded_flops(model: torch.nn.Module) -> int:
    """Per-example FLOPs that ``model``'s modules compute and throw away by design, as they declare them.

    The multi-surface head scores every surface in one matrix product and keeps each example's own
    (:mod:`opengem.ops.surface_head`); the other surfaces' products are executed, but are not model FLOPs.
    """
    return sum(int(m.discarded_flops_per_example()) for m in model.modules()
               if callable(getattr(m, "discarded_flops_per_example", None)))


def measured_flops(model: torch.nn.Module, batch: Batch) -> float:
    """Model forward FLOPs per example as counted by :func:`flop_counter` on ``batch`` (no autograd), less
    the work the modules declare discarded (:func:`discarded_flops`): comparable with the analytic count."""
    with torch.no_grad(), flop_counter() as counter:
        model(batch)
    return counter.get_total_flops() / max(batch.batch_size, 1) - discarded_flops(model)
