"""Fused twins against the reference ops, forward and backward: RoPE on every layout GEM uses.

Shapes cover GEM's layouts (token-major [B, L, H, dh] with positions [L, 1], head-major [B, H, L, dh] with
positions [L] or per row), batch 1, zero-length sequences, an empty batch and odd head widths (which the
fused kernel hands to the reference).
"""

from __future__ import annotations

import pytest
import torch

from opengem.ops import attention
from opengem.ops.kernel import Kernel, resolve_kernel
from twin_helpers import rand, run_fwd_bwd

ATOL, RTOL = 1e-5, 1e-4


def _same(ref: tuple, fused: tuple) -> None:
    (o_ref, g_ref), (o_fused, g_fused) = ref, fused
    assert o_ref.shape == o_fused.shape
    torch.testing.assert_close(o_fused, o_ref, atol=ATOL, rtol=RTOL)
    for a, b in zip(g_ref, g_fused):
        if a is None and b is None:
            continue
        a = torch.zeros_like(b) if a is None else a
        b = torch.zeros_like(a) if b is None else b
        torch.testing.assert_close(b, a, atol=ATOL, rtol=RTOL)


# (x shape, pos) pairs: head-major with [L] positions, per-row positions, token-major with [L, 1]
ROPE_CASES = [
    ((3, 2, 5, 8), lambda: torch.arange(5)),
    ((1, 2, 5, 8), lambda: torch.arange(5)),  # batch 1
    ((3, 2, 0, 8), lambda: torch.arange(0)),  # zero-length sequences
    ((0, 2, 4, 8), lambda: torch.arange(4)),  # an empty batch
    ((3, 2, 4, 8), lambda: torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8], [2, 2, 2, 2]])[:, None]),  # per row
    ((3, 6, 2, 8), lambda: torch.arange(6)[:, None]),  # token-major [B, L, H, dh]
    ((3, 2, 5, 7), lambda: torch.arange(5)),  # odd head width: the last channel passes through
]


@pytest.mark.parametrize("shape,pos", ROPE_CASES)
def test_fused_rope_matches_reference_forward_and_backward(shape, pos):
    x = rand(*shape, seed=1)
    ref = run_fwd_bwd(lambda t: attention.rope(t, pos(), 100.0), [x])
    fused = run_fwd_bwd(lambda t: attention.rope(t, pos(), 100.0, kernel="fused"), [x])
    _same(ref, fused)


def test_fused_rope_accepts_strided_views():
    """The model hands transposed views; the fused kernel makes them contiguous itself."""
    x = rand(4, 6, 2, 8, seed=2).transpose(1, 2)  # head-major view of a token-major tensor
    pos = torch.arange(6)[:, None]
    _same(run_fwd_bwd(lambda t: attention.rope(t.transpose(1, 2), pos), [x]),
          run_fwd_bwd(lambda t: attention.rope(t.transpose(1, 2), pos, kernel="fused"), [x]))


def test_only_ops_with_a_fused_twin_accept_it():
    assert resolve_kernel("fused", (Kernel.PYTORCH, Kernel.FUSED)) is Kernel.FUSED
    q = rand(2, 1, 3, 4, seed=9)
    with pytest.raises(ValueError, match="kernel 'fused' is not one of: pytorch$"):
        attention.safe_key_mask(q[:, 0, 0] > 0, kernel="fused")
    with pytest.raises(ValueError, match="kernel 'fused' is not one of: pytorch, cpp$"):
        attention.masked_attention(q, q, q, None, kernel="fused")


# token-major [..., L, H, dh] rows at positions 0..L-1: GEM's self-attention layout, batch 1, zero-length
# rows, an empty batch, one head, odd widths (handed to the reference)
ROPE_POSITION_SHAPES = [(3, 6, 2, 8), (1, 5, 2, 16), (3, 0, 2, 8), (0, 4, 2, 8), (2, 7, 1, 4), (3, 5, 2, 7)]


@pytest.mark.parametrize("shape", ROPE_POSITION_SHAPES)
def test_fused_rope_positions_matches_reference_forward_and_backward(shape):
    x = rand(*shape, seed=3)
    ref = run_fwd_bwd(lambda t: attention.rope_positions(t, 100.0), [x])
    fused = run_fwd_bwd(lambda t: attention.rope_positions(t, 100.0, kernel="fused"), [x])
    _same(ref, fused)
    # and the reference is rope() at positions [L, 1] (what the fused MultiHeadAttention used to call)
    pos = torch.arange(shape[1])[:, None]
    _same(ref, run_fwd_bwd(lambda t: attention.rope(t, pos, 100.0), [x]))


def test_fused_rope_positions_on_a_strided_view_and_with_tables_cached_in_inference_mode():
    """A head-major view is made contiguous; tables first built under inference_mode still train."""
    with torch.inference_mode():
        attention.rope_positions(rand(2, 6, 2, 8, seed=4), 10.0, kernel="fused")
    x = rand(2, 2, 6, 8, seed=5)
    _same(run_fwd_bwd(lambda t: attention.rope_positions(t.transpose(1, 2), 10.0), [x]),
          run_fwd_bwd(lambda t: attention.rope_positions(t.transpose(1, 2), 10.0, kernel="fused"), [x]))
