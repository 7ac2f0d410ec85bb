"""opengem.ops.attention against plain per-row, per-head loops: forward and backward, empty rows, FLOPs."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from opengem.ops import attention, flop_formulas
from twin_helpers import rand

H, DH = 2, 4
ATOL = 1e-5

# key lengths per row: empty rows, an all-padding batch, a full row, a batch of none
LENGTHS = [[3, 0, 5, 1], [0, 0], [6], []]


def _mask(lengths: list[int], L: int) -> torch.Tensor:
    rows = [[j < n for j in range(L)] for n in lengths]
    return torch.tensor(rows, dtype=torch.bool).reshape(len(lengths), L)


def _grads(fn, *inputs: torch.Tensor, seed: int = 9) -> tuple[torch.Tensor, list[torch.Tensor]]:
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    out = out[0] if isinstance(out, tuple) else out
    if out.requires_grad:
        (out * rand(*out.shape, seed=seed)).sum().backward()
    return out.detach(), [x.grad if x.grad is not None else torch.zeros_like(x) for x in leaves]


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape
    assert torch.allclose(a, b, atol=ATOL, rtol=1e-4), (a - b).abs().max()


def _ref_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One row, one head: softmax(q kᵀ / √dh) v, written out."""
    scores = q @ k.T / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


def _ref_masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Row by row and head by head over the row's real keys; a row with none attends to its first slot."""
    rows = []
    for b in range(q.shape[0]):
        keep = list(range(k.shape[2])) if mask is None else [j for j in range(k.shape[2]) if mask[b, j]]
        keep = keep or [0]
        rows.append(torch.stack([_ref_one(q[b, h], k[b, h, keep], v[b, h, keep]) for h in range(q.shape[1])]))
    return torch.stack(rows) if rows else q * 0


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("lq", [1, 3])
def test_masked_attention_forward_and_backward(lengths, lq):
    B, L = len(lengths), 6
    q, k, v = rand(B, H, lq, DH, seed=0), rand(B, H, L, DH, seed=1), rand(B, H, L, DH, seed=2)
    mask = _mask(lengths, L)
    out, grads = _grads(lambda a, b, c: attention.masked_attention(a, b, c, mask), q, k, v)
    ref, ref_grads = _grads(lambda a, b, c: _ref_masked(a, b, c, mask), q, k, v)
    _close(out, ref)
    for g, rg in zip(grads, ref_grads):
        _close(g, rg)
    # padded keys get no gradient, except slot 0 of an empty row (the one it attends to)
    for b, n in enumerate(lengths):
        assert grads[1][b, :, max(n, 1) :].abs().sum() == 0


def test_masked_attention_without_mask_uses_every_key():
    q, k, v = rand(2, H, 3, DH, seed=0), rand(2, H, 5, DH, seed=1), rand(2, H, 5, DH, seed=2)
    _close(attention.masked_attention(q, k, v), _ref_masked(q, k, v, None))


@pytest.mark.parametrize("lengths", LENGTHS)
def test_pooled_attention_forward_backward_and_valid_mask(lengths):
    B, L, M = len(lengths), 6, 3
    q, k, v = rand(B, H, M, DH, seed=3), rand(B, H, L, DH, seed=4), rand(B, H, L, DH, seed=5)
    mask = _mask(lengths, L)
    out, grads = _grads(lambda a, b, c: attention.pooled_attention(a, b, c, mask), q, k, v)
    ref, ref_grads = _grads(lambda a, b, c: _ref_masked(a, b, c, mask), q, k, v)
    _close(out, ref)
    for g, rg in zip(grads, ref_grads):
        _close(g, rg)
    valid = attention.pooled_attention(q, k, v, mask)[1]
    assert valid.tolist() == [[n > 0] * M for n in lengths]
    unmasked = attention.pooled_attention(q, k, v)[1]
    assert unmasked.shape == (B, M) and unmasked.all()


@pytest.mark.parametrize("lengths", LENGTHS)
def test_jagged_attention_forward_and_backward(lengths):
    n = sum(lengths)
    q, k, v = rand(n, H, DH, seed=6), rand(n, H, DH, seed=7), rand(n, H, DH, seed=8)
    lt = torch.tensor(lengths, dtype=torch.long)

    def ref(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        rows, start = [], 0
        for m in lengths:
            s = slice(start, start + m)
            if m:
                heads = [_ref_one(a[s, h], b[s, h], c[s, h]) for h in range(H)]
                rows.append(torch.stack(heads, dim=1))
            start += m
        return torch.cat(rows) if rows else a * 0

    max_len = max(lengths, default=0) + 2  # padding beyond the longest row must not matter
    out, grads = _grads(lambda a, b, c: attention.jagged_attention(a, b, c, lt, max_len), q, k, v)
    ref_out, ref_grads = _grads(ref, q, k, v)
    _close(out, ref_out)
    for g, rg in zip(grads, ref_grads):
        _close(g, rg)
    offsets = torch.tensor([0, *torch.tensor(lengths, dtype=torch.long).cumsum(0).tolist()])
    _close(attention.jagged_attention(q, k, v, lt, max_len, offsets=offsets), ref_out)


@pytest.mark.parametrize("dh", [4, 5])
def test_rope_forward_and_backward_against_pairwise_rotation(dh):
    base = 100.0
    x = rand(2, H, 5, dh, seed=10)
    pos = torch.tensor([0, 1, 2, 7, 30])

    def ref(t: torch.Tensor) -> torch.Tensor:
        """Position by position, pair (i, i + half) by pair: a 2-D rotation by pos · base^(-i/half)."""
        half = dh // 2
        out = t.clone()
        for p_i, p in enumerate(pos.tolist()):
            for i in range(half):
                theta = torch.tensor(p * base ** (-i / half))
                a, b = t[..., p_i, i], t[..., p_i, i + half]
                out[..., p_i, i] = a * theta.cos() - b * theta.sin()
                out[..., p_i, i + half] = a * theta.sin() + b * theta.cos()
        return out  # an odd last dim passes through unrotated

    out, g = _grads(lambda t: attention.rope(t, pos, base), x)
    ref_out, ref_g = _grads(ref, x)
    _close(out, ref_out)
    _close(g[0], ref_g[0])


@pytest.mark.parametrize("L,dh", [(1, 2), (5, 4), (24, 8), (16, 16)])
def test_rotate_with_tables_equals_rope_at_positions_0_to_L(L, dh):
    """The form a program traced for Inductor runs (tables made once, then ``rotate``) against the
    reference at positions 0..L-1, values and gradients."""
    x = rand(3, H, L, dh, seed=L + dh)
    cos, sin = attention.rope_tables(L, dh, 500.0)
    assert cos.shape == sin.shape == (L, dh)
    ref_out, ref_g = _grads(lambda t: attention.rope(t, torch.arange(L), 500.0), x)
    for kernel in ("pytorch", "fused"):
        out, g = _grads(lambda t, k=kernel: attention.rotate(t, cos, sin, kernel=k), x)
        _close(out, ref_out)
        _close(g[0], ref_g[0])
    with pytest.raises(ValueError, match="even width"):
        attention.rope_tables(L, 5)


def test_safe_key_mask_only_opens_slot_zero_of_empty_rows():
    mask = _mask([2, 0, 3, 0], 4)
    safe = attention.safe_key_mask(mask)
    expected = mask.clone()
    for b in range(4):
        if not mask[b].any():
            expected[b, 0] = True
    assert torch.equal(safe, expected)
    assert attention.safe_key_mask(torch.zeros(0, 4, dtype=torch.bool)).shape == (0, 4)


def test_flop_formulas_count_attention_in_a_scoped_counter_only():
    formulas = flop_formulas()
    assert formulas == attention.flop_formulas() and formulas is not flop_formulas()  # fresh dict each call
    B, Lq, Lk = 2, 3, 5
    q = rand(B, H, Lq, DH, seed=0).requires_grad_(True)
    k, v = rand(B, H, Lk, DH, seed=1), rand(B, H, Lk, DH, seed=2)
    mask = _mask([5, 2], Lk)
    forward = sdpa_flop_count((B, H, Lq, DH), (B, H, Lk, DH), (B, H, Lk, DH))
    with FlopCounterMode(display=False, custom_mapping=formulas) as counter:
        out = attention.masked_attention(q, k, v, mask)
    assert counter.get_total_flops() == forward
    with FlopCounterMode(display=False, custom_mapping=formulas) as counter:
        out.sum().backward()
    # the CUDA kernels' backward formula: recomputed scores, dP, dV, dQ, dK = 2.5 x the forward here
    backward = sdpa_backward_flop_count((B, H, Lq, DH), (B, H, Lq, DH), (B, H, Lk, DH), (B, H, Lk, DH))
    assert counter.get_total_flops() == backward == 5 * forward // 2
    with FlopCounterMode(display=False) as plain:  # torch's own registry was left alone
        attention.masked_attention(q, k, v, mask)
    if formulas:  # a torch that counts its CPU flash kernel itself needs no formula from us
        assert plain.get_total_flops() == 0


def test_cpu_bf16_attention_runs_in_fp32_and_returns_bf16() -> None:
    """bf16 q/k/v on CPU: SDPA in fp32 (its bf16 backward is ~10x slower here), result and grads in bf16."""
    from opengem.ops.pytorch import pt_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 5, 8, generator=g).to(torch.bfloat16).requires_grad_() for _ in range(3))
    mask = torch.tensor([[True] * 5, [True, True, False, False, False], [False] * 5])
    out = pt_attention.masked_attention(q, k, v, mask)
    assert out.dtype == torch.bfloat16
    ref = pt_attention.masked_attention(q.float(), k.float(), v.float(), mask)
    assert torch.equal(out, ref.to(torch.bfloat16))
    out.float().sum().backward()
    assert q.grad is not None and q.grad.dtype == torch.bfloat16 and torch.isfinite(q.grad.float()).all()
