"""Jagged <-> padded ops: the one place a jagged batch becomes right-padded rows + mask, and back.

Sequences stay jagged (values + offsets) until a model pads them; padding is a model-side choice. Every
op takes ``kernel`` (see :mod:`opengem.ops.kernel`) and today runs the reference in
:mod:`opengem.ops.pytorch.pt_jagged`. Conventions: ``lengths`` [B] and ``offsets`` [B + 1] (offsets[0] = 0)
describe B rows of ``values`` [N, ...], N = sum(lengths); padded rows are [B, L, ...] with real events
first, oldest first, and a bool mask [B, L], True = real. This module imports only torch (and FBGEMM's ops
through the reference) so that data/ and model/ can both sit on it.
"""

from __future__ import annotations

import torch

from opengem.ops.kernel import Kernel, resolve_kernel
from opengem.ops.pytorch import pt_jagged


def lengths_to_offsets(lengths: torch.Tensor, *, kernel: Kernel | str = Kernel.PYTORCH) -> torch.Tensor:
    """[B] lengths -> [B + 1] offsets (0 first), same dtype: where each row's values start and end."""
    resolve_kernel(kernel)
    return pt_jagged.lengths_to_offsets(lengths)


def offsets_to_lengths(offsets: torch.Tensor, *, kernel: Kernel | str = Kernel.PYTORCH) -> torch.Tensor:
    """[B + 1] offsets -> [B] lengths (the inverse of :func:`lengths_to_offsets`)."""
    resolve_kernel(kernel)
    return pt_jagged.offsets_to_lengths(offsets)


def padding_mask(
    lengths: torch.Tensor, max_len: int, *, kernel: Kernel | str = Kernel.PYTORCH
) -> torch.Tensor:
    """[B, max_len] bool, True at the first ``lengths[b]`` slots of row b (the right-padded convention)."""
    resolve_kernel(kernel)
    return pt_jagged.padding_mask(lengths, max_len)


def jagged_to_padded(
    values: torch.Tensor,
    lengths: torch.Tensor,
    max_len: int,
    padding_value: float = 0.0,
    *,
    offsets: torch.Tensor | None = None,
    kernel: Kernel | str = Kernel.PYTORCH,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Jagged ``values`` [N, *inner] of rows ``lengths`` -> (padded [B, max_len, *inner], mask [B, max_len]).

    Slots past a row's end hold ``padding_value``; a row longer than ``max_len`` keeps its first max_len
    events (callers that must not cut check lengths first). Pass ``offsets`` when already computed.
    Differentiable in ``values``. Dtypes: FBGEMM's (float32/16, bfloat16, int32, int64), not bool or float64.
    """
    resolve_kernel(kernel)
    if offsets is None:
        offsets = pt_jagged.lengths_to_offsets(lengths)
    padded = pt_jagged.jagged_to_padded(values, offsets, max_len, padding_value)
    return padded, pt_jagged.padding_mask(lengths, max_len)


def keep_last_index(
    lengths: torch.Tensor, k: int, *, kernel: Kernel | str = Kernel.PYTORCH
) -> tuple[torch.Tensor, torch.Tensor]:
    """(index, kept lengths) that keep each row's last ``k`` values of a jagged batch, still jagged.

    Lists are oldest first, so these are each row's ``k`` most recent events: ``values.index_select(0,
    index)`` with the kept lengths ``min(lengths, k)`` is the truncated batch (one index for every field of
    a sequence group). The index is sorted, so each row's kept events stay in order.
    """
    resolve_kernel(kernel)
    if k < 1:
        raise ValueError(f"keep_last_index: k must be >= 1 (got {k})")
    return pt_jagged.keep_last_index(lengths, k)


def padded_to_jagged(
    padded: torch.Tensor,
    lengths: torch.Tensor,
    *,
    offsets: torch.Tensor | None = None,
    total: int | None = None,
    kernel: Kernel | str = Kernel.PYTORCH,
) -> torch.Tensor:
    """Right-padded rows [B, L, *inner] -> jagged values [sum(lengths), *inner]; padding is dropped.

    ``total`` (= sum(lengths)) spares a device sync when known. Every ``lengths[b]`` must be <= L.
    """
    resolve_kernel(kernel)
    if offsets is None:
        offsets = pt_jagged.lengths_to_offsets(lengths)
    return pt_jagged.padded_to_jagged(padded, offsets, total)


def zero_padding(
    values: torch.Tensor, mask: torch.Tensor, *, kernel: Kernel | str = Kernel.PYTORCH
) -> torch.Tensor:
    """``values`` [B, L, d] with every masked-out slot set to 0 (a multiply, so FX/compile see no writes)."""
    resolve_kernel(kernel)
    return pt_jagged.zero_padding(values, mask)


def ensure_nonempty(
    values: torch.Tensor, mask: torch.Tensor, *, kernel: Kernel | str = Kernel.PYTORCH
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad a batch whose padded length is 0 to one (masked) slot, so attention always has a key."""
    resolve_kernel(kernel)
    return pt_jagged.ensure_nonempty(values, mask)


def gather_last(
    values: torch.Tensor, lengths: torch.Tensor, k: int, *, kernel: Kernel | str = Kernel.PYTORCH
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exactly ``k`` slots: the last k real events of each right-padded row, oldest first, right-padded.

    ``k = 1`` is the last valid element of each row. Needs at least one padded slot (see
    :func:`ensure_nonempty`); slots past a short row are masked and zero.
    """
    resolve_kernel(kernel)
    return pt_jagged.gather_last(values, lengths, k)


def compact(
    values: torch.Tensor, mask: torch.Tensor, *, kernel: Kernel | str = Kernel.PYTORCH
) -> tuple[torch.Tensor, torch.Tensor]:
    """Move each row's real tokens to the front, keeping their order (back to the right-padded convention).

    Needed after concatenating padded pieces (groups, pyramid branches): real tokens then sit between
    padding. Masked-out slots come back zero.
    """
    resolve_kernel(kernel)
    return pt_jagged.compact(values, mask)
