"""Length buckets: run a per-row block on groups of rows of similar length instead of the whole batch.

A right-padded batch is as wide as its longest row, so a batch of histories with mean 24 and maximum 64
events pays for 64 in every row. Split into buckets of rows of similar length, each padded only to its own
longest row, a per-row block (attention over each row's events, per-token norms and projections) does the
same work per real event for a fraction of the padding; its outputs go back to the batch's row order.
The split is exact only for blocks with no cross-row op (BatchNorm, batch statistics) and, in training,
no randomness whose draws depend on the batch's shape (dropout draws other masks on other shapes).

Ops: :func:`length_buckets` (which rows, and how wide), :func:`take_rows` (gather those rows, cut the
padding to the bucket's width), :func:`restore_rows` (bucket outputs back in the batch's order). Each takes
``kernel`` (:mod:`opengem.ops.kernel`) and runs the reference in :mod:`opengem.ops.pytorch.pt_length_buckets`.
"""

from __future__ import annotations

import torch

from opengem.ops.kernel import Kernel, resolve_kernel
from opengem.ops.pytorch import pt_length_buckets


def length_buckets(
    lengths: torch.Tensor, k: int, *, kernel: Kernel | str = Kernel.PYTORCH
) -> list[tuple[torch.Tensor, int]]:
    """At most ``k`` buckets of rows of similar length: [(row indices [n_b] int64, longest length in it)].

    The rule (cheap, deterministic, one host sync): rows stably sorted by length, cut into ``k`` runs of
    near-equal size (sizes differ by at most one), neighbouring runs with the same longest length merged
    (padding them apart saves nothing). Buckets come shortest first; every row is in exactly one; a batch
    of no rows has none; ``k`` larger than the batch gives at most one row per bucket. The longest length
    may be 0 (a bucket of empty rows): the caller chooses the width it pads to.
    """
    resolve_kernel(kernel)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"length_buckets: k must be an int >= 1, got {k!r}")
    if lengths.dim() != 1:
        raise ValueError(f"length_buckets: lengths must be 1-D [B], got shape {tuple(lengths.shape)}")
    return pt_length_buckets.length_buckets(lengths, k)


def take_rows(
    values: torch.Tensor,
    mask: torch.Tensor,
    rows: torch.Tensor,
    width: int,
    *,
    kernel: Kernel | str = Kernel.PYTORCH,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``rows`` of right-padded ``values`` [B, L, *inner] and ``mask`` [B, L], cut to ``width`` slots.

    Lossless when every chosen row has at most ``width`` real events (right padding: its events are its
    first slots); a ``width`` above L keeps L. Differentiable in ``values`` (backward: an index_add).
    """
    resolve_kernel(kernel)
    return pt_length_buckets.take_rows(values, mask, rows, width)


def restore_rows(
    parts: list[torch.Tensor], rows: list[torch.Tensor], *, kernel: Kernel | str = Kernel.PYTORCH
) -> torch.Tensor:
    """The inverse of taking ``rows`` (which together list every batch row once): ``parts[i]`` [n_i, ...]
    holds the outputs of rows ``rows[i]``; returns [sum n_i, ...] in the batch's row order."""
    resolve_kernel(kernel)
    if len(parts) != len(rows) or not parts:
        raise ValueError(f"restore_rows: need one row list per part and at least one part "
                         f"(got {len(parts)} parts, {len(rows)} row lists)")
    return pt_length_buckets.restore_rows(parts, rows)
