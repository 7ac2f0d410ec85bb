"""Fused RoPE twin: rotation on contiguous rows with full-width tables, no slicing, no cat.

Why: the reference rotates strided head views (q, k after a transpose), multiplying half-width slices (a
slow strided TensorIterator path) and concatenating the halves (a copy forward, zero-filled slice
gradients backward); in GEM-small's step profile those strided multiplies were the largest elementwise
item. Here RoPE is ``x * cos + rotate_half(x) * sin`` on a contiguous tensor (one roll copy), with the
sign folded into the sin table and both tables materialised over the heads. (Folding rotate_half into a
second projection by the row-permuted weight was tried: it adds matmul FLOPs that executed-FLOP counts
would then report as useful work.) The attention core stays the reference's SDPA: measured here, its CPU
flash kernel beats baddbmm + softmax + bmm at GEM's shapes (about 2x on fwd + bwd), because CPU bmm
backward on transposed operands falls back to one small matmul per (row, head).
Same math as the reference (the tests pin forward and backward equality).

``rope_positions`` (token-major rows at positions 0..L-1, what every GEM self-attention uses): the tables
are cached per (length, heads, width, dtype) instead of rebuilt (arange, cos, sin, two cats, two dense
copies) for q and for k at every call, and one autograd Function applies the rotation, so backward is two
multiplies and a roll with nothing saved but the tables (autograd's generic path keeps the roll's and both
products' inputs and runs roll, mul, mul, add backward nodes).
"""

from __future__ import annotations

import functools

import torch

from opengem.ops.pytorch import pt_attention


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE with given full-width tables (``pt_attention.rope_tables``): ``x * cos + roll(x, dh/2) *
    sin``, the halves swapped by one ``roll`` instead of the reference's ``cat`` of two slices."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


def _dense_tables(pos: torch.Tensor, shape: torch.Size, base: float, dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Tables materialised over every trailing dim they broadcast on (e.g. [L, 1, dh] -> [L, H, dh]).

    A table broadcast inside the row (over heads) leaves TensorIterator a 16-wide inner loop; a dense one
    lets it fuse the trailing dims into one long vectorised loop (measured ~3x faster on the multiplies).
    """
    cos, sin = pt_attention.rope_tables(pos, shape[-1], base, dtype)
    n = min(cos.dim(), len(shape))
    trailing = torch.broadcast_shapes(cos.shape[-n:], shape[-n:])
    return tuple(t.expand(*t.shape[:-n], *trailing).contiguous() for t in (cos, sin))  # type: ignore[return-value]


def rope(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    dh = x.shape[-1]
    if dh % 2:  # an odd last dim passes its last channel through: rare, keep the reference's form
        return pt_attention.rope(x, pos, base)
    cos, sin = _dense_tables(pos, x.shape, base, x.dtype)
    x = x.contiguous()
    rotated = x.roll(dh // 2, dims=-1)  # [x2, x1] (the sign lives in ``sin``); roll: 2x faster than flip
    return torch.addcmul(x * cos, rotated, sin)


@functools.lru_cache(maxsize=64)
def _position_tables(length: int, heads: int, dh: int, base: float, dtype: torch.dtype, device: torch.device
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, signed sin) [L, H, dh] for positions 0..L-1, dense over the heads (long vectorised inner loops,
    see :func:`_dense_tables`). Constants: cached per shape, never differentiated; built outside inference
    mode so that a cache first filled while serving still works in training."""
    with torch.inference_mode(False), torch.no_grad():
        pos = torch.arange(length, device=device)[:, None]
        return _dense_tables(pos, torch.Size((length, heads, dh)), base, dtype)


class _Rotate(torch.autograd.Function):
    """x * cos + roll(x, dh/2) * sin; backward: the transposed rotation (a roll by dh/2 is its own inverse),
    with nothing saved but the cached tables."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        ctx.save_for_backward(cos, sin)
        return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin)

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # noqa: ANN001
        cos, sin = ctx.saved_tensors
        return (g * sin).roll(g.shape[-1] // 2, dims=-1).add_(g * cos), None, None


def rope_positions(x: torch.Tensor, base: float) -> torch.Tensor:
    L, H, dh = x.shape[-3:]
    if dh % 2 or torch.compiler.is_compiling():  # odd widths: the reference's form; compile: no cache
        return pt_attention.rope_positions(x, base)
    cos, sin = _position_tables(L, H, dh, float(base), x.dtype, x.device)
    return _Rotate.apply(x.contiguous(), cos, sin)
