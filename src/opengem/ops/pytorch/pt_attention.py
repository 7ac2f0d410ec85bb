"""Reference attention ops: RoPE, key-padding masks and multi-head attention on PyTorch's SDPA.

Shapes follow SDPA: q [B, H, Lq, dh], k and v [B, H, Lk, dh]; key masks are [B, Lk] bool, True = real.
A row with no real key attends to its first slot (callers zero padded slots), so it never yields NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils import flop_counter

from opengem.ops.pytorch import pt_jagged


def safe_key_mask(mask: torch.Tensor) -> torch.Tensor:
    first = torch.arange(mask.shape[-1], device=mask.device) == 0  # functional: no in-place writes (FX)
    return mask | (first & ~mask.any(dim=-1, keepdim=True))


def rope(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    dh = x.shape[-1]
    half = dh // 2
    freqs = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    ang = pos.to(torch.float32)[..., None] * freqs  # [..., L, half]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half : 2 * half]
    rotated = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return torch.cat([rotated, x[..., 2 * half :]], dim=-1) if dh % 2 else rotated


def rope_tables(pos: torch.Tensor, dh: int, base: float, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-width (cos, signed sin) [..., dh] of positions ``pos`` (even dh): the halves' angles repeated,
    the sine negated on the first half, so that a rotation is two products and a sum (:func:`rotate`)."""
    half = dh // 2
    freqs = base ** (-torch.arange(half, device=pos.device, dtype=torch.float32) / half)
    ang = pos.to(torch.float32)[..., None] * freqs
    cos, sin = ang.cos(), ang.sin()
    return torch.cat([cos, cos], dim=-1).to(dtype), torch.cat([-sin, sin], dim=-1).to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE with :func:`rope_tables`: ``x * cos + [x2, x1] * sin`` (halves swapped by ``cat``)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([x[..., half:], x[..., :half]], dim=-1) * sin


def masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None
) -> torch.Tensor:
    attn_mask = None if key_mask is None else safe_key_mask(key_mask)[:, None, None, :]
    if q.device.type == "cpu" and q.dtype == torch.bfloat16:
        # PyTorch's CPU flash-attention backward in bf16 runs ~10x slower than in fp32 at GEM's shapes
        # (measured: 885 vs 46 ms a step at [512, 2, 32, 16]); attention is a small share of the FLOPs, so
        # it runs in fp32 and only the dense matmuls around it use the bf16 matrix units.
        with torch.autocast("cpu", enabled=False):
            o = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=attn_mask)
        return o.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)


def jagged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor,
    max_len: int,
) -> torch.Tensor:
    """Jagged [N, H, dh] -> padded [B, H, L, dh] + key mask -> masked attention -> jagged [N, H, dh]."""
    def pad(x: torch.Tensor) -> torch.Tensor:
        return pt_jagged.jagged_to_padded(x, offsets, max_len, 0.0).transpose(1, 2)

    mask = pt_jagged.padding_mask(lengths, max_len)
    o = masked_attention(pad(q), pad(k), pad(v), mask)
    return pt_jagged.padded_to_jagged(o.transpose(1, 2), offsets, q.shape[0])


def pooled_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None,
    core: Callable[..., torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`masked_attention` (or another ``core`` of the same contract) plus which rows had a real key."""
    B, _, M, _ = q.shape
    out = (core or masked_attention)(q, k, v, key_mask)
    if key_mask is None:
        return out, torch.ones(B, M, dtype=torch.bool, device=q.device)
    return out, (key_mask.sum(1) > 0)[:, None].expand(B, M)


def _sdpa_flop(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return flop_counter.sdpa_flop_count(query, key, value)  # shapes: FlopCounterMode's shape wrapper


def _sdpa_backward_flop(grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None,
                        **kwargs: Any) -> int:
    return flop_counter.sdpa_backward_flop_count(grad_out, query, key, value)


def flop_formulas() -> dict[Any, Callable[..., int]]:
    """FlopCounterMode formulas for the SDPA kernels this reference reaches that torch does not count.

    torch counts its CUDA SDPA kernels but not the CPU flash kernel (nor its backward) that
    ``masked_attention`` runs on CPU: give them the same formulas as the CUDA ones.
    """
    aten = torch.ops.aten
    formulas: dict[Any, Callable[..., int]] = {}
    for name, fn in (("_scaled_dot_product_flash_attention_for_cpu", _sdpa_flop),
                     ("_scaled_dot_product_flash_attention_for_cpu_backward", _sdpa_backward_flop)):
        op = getattr(aten, name, None)
        if op is not None and op not in flop_counter.flop_registry:
            formulas[op] = fn
    return formulas


def rope_positions(x: torch.Tensor, base: float) -> torch.Tensor:
    """RoPE of token-major rows [..., L, H, dh] at positions 0..L-1 (the form MultiHeadAttention's fused
    path used before it had its own op)."""
    return rope(x, torch.arange(x.shape[-3], device=x.device)[:, None], base)
