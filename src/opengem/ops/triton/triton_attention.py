"""Jagged self-attention in Triton: flash attention over packed rows, with no padding at all.

q, k, v are packed events [N, H, dh] of B rows (``offsets`` [B + 1]); each event attends to every event of
its own row. One program owns (a block of queries, a row, a head) and streams that row's keys through an
online softmax (FlashAttention-2's forward), so no [B, H, max_len, max_len] score tensor and no padded copy
of q/k/v ever exists; a row of length 0 has no queries and costs nothing. The forward keeps the
log-sum-exp of every query; the backward recomputes the probabilities from it in two kernels (dK/dV per key
block, dQ per query block), so there are no atomics and the result is deterministic.

Exactness: fp32 inputs multiply in IEEE fp32 (``input_precision="ieee"``, not TF32) so that the twin test's
1e-5 tolerance holds on a GPU as it does in the interpreter; bf16/fp16 inputs use the tensor cores and
accumulate in fp32. Reference: :func:`opengem.ops.pytorch.pt_attention.jagged_attention`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from opengem.ops.triton import block


@triton.jit
def _tile(P, base, r, rd, r_ok, d_ok, stride_n):
    """Rows ``r`` x dims ``rd`` of one row's head, zero outside the row and beyond dh."""
    mask = r_ok[:, None] & d_ok[None, :]
    return tl.load(P + base + r[:, None] * stride_n + rd[None, :], mask=mask, other=0.0)


@triton.jit
def _store_tile(P, x, base, r, rd, r_ok, d_ok, stride_n):
    tl.store(P + base + r[:, None] * stride_n + rd[None, :], x.to(P.dtype.element_ty),
             mask=r_ok[:, None] & d_ok[None, :])


@triton.jit
def _program(OFF, DH, stride_n, stride_h, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's (block, row, head): the row's first event and length, the block's event indices
    ``r`` and dims ``rd`` with their masks, and the offset of (row, head) in the packed [N, H, dh] tensors.
    The block is active when ``r0 < length``."""
    pid, row, head = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    start = tl.load(OFF + row)
    length = tl.load(OFF + row + 1) - start
    r0 = pid * BLOCK
    r, rd = r0 + tl.arange(0, BLOCK), tl.arange(0, BLOCK_D)
    return start, length, head, r0, r, rd, r < length, rd < DH, start * stride_n + head * stride_h


@triton.jit
def _probs(q, k, lse, m_ok, n_ok, scale, PREC: tl.constexpr):
    """The forward's softmax probabilities of a query x key tile, rebuilt from each query's log-sum-exp."""
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
    return tl.where(m_ok[:, None] & n_ok[None, :], tl.exp(s - lse[:, None]), 0.0)


@triton.jit
def _query_stats(LSE, DELTA, start, rm, H, head, m_ok):
    """Each query's log-sum-exp (from the forward) and rowsum(dO * O) (from the backward's prologue)."""
    at = (start + rm) * H + head
    return tl.load(LSE + at, mask=m_ok, other=0.0), tl.load(DELTA + at, mask=m_ok, other=0.0)


@triton.jit
def _score_grads(p, do, v, delta, PREC: tl.constexpr):
    """dL/dS of the scaled scores: P * (dO Vᵀ - rowsum(dO * O))."""
    return p * (tl.dot(do, tl.trans(v), input_precision=PREC) - delta[:, None])


@triton.jit
def _fwd(Q, K, V, O, LSE, OFF, scale, stride_n, stride_h, H, DH,
         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PREC: tl.constexpr):
    start, length, head, r0, rm, rd, m_ok, d_ok, base = _program(OFF, DH, stride_n, stride_h, BLOCK_M,
                                                               BLOCK_D)
    if r0 < length:
        q = _tile(Q, base, rm, rd, m_ok, d_ok, stride_n)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for n0 in range(0, length, BLOCK_N):
            rn = n0 + tl.arange(0, BLOCK_N)
            n_ok = rn < length
            k = _tile(K, base, rn, rd, n_ok, d_ok, stride_n)
            v = _tile(V, base, rn, rd, n_ok, d_ok, stride_n)
            s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
            s = tl.where(n_ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
            m_i = m_new
        _store_tile(O, acc / l_i[:, None], base, rm, rd, m_ok, d_ok, stride_n)
        tl.store(LSE + (start + rm) * H + head, m_i + tl.log(l_i), mask=m_ok)


@triton.jit
def _bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, OFF, scale, stride_n, stride_h, H, DH,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PREC: tl.constexpr):
    start, length, head, r0, rn, rd, n_ok, d_ok, base = _program(OFF, DH, stride_n, stride_h, BLOCK_N,
                                                               BLOCK_D)
    if r0 < length:
        k = _tile(K, base, rn, rd, n_ok, d_ok, stride_n)
        v = _tile(V, base, rn, rd, n_ok, d_ok, stride_n)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        for m0 in range(0, length, BLOCK_M):
            rm = m0 + tl.arange(0, BLOCK_M)
            m_ok = rm < length
            q = _tile(Q, base, rm, rd, m_ok, d_ok, stride_n)
            do = _tile(DO, base, rm, rd, m_ok, d_ok, stride_n)
            lse, delta = _query_stats(LSE, DELTA, start, rm, H, head, m_ok)
            p = _probs(q, k, lse, m_ok, n_ok, scale, PREC)
            dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision=PREC)
            ds = _score_grads(p, do, v, delta, PREC)
            dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PREC)
        _store_tile(DK, dk * scale, base, rn, rd, n_ok, d_ok, stride_n)
        _store_tile(DV, dv, base, rn, rd, n_ok, d_ok, stride_n)


@triton.jit
def _bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, OFF, scale, stride_n, stride_h, H, DH,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PREC: tl.constexpr):
    start, length, head, r0, rm, rd, m_ok, d_ok, base = _program(OFF, DH, stride_n, stride_h, BLOCK_M,
                                                               BLOCK_D)
    if r0 < length:
        q = _tile(Q, base, rm, rd, m_ok, d_ok, stride_n)
        do = _tile(DO, base, rm, rd, m_ok, d_ok, stride_n)
        lse, delta = _query_stats(LSE, DELTA, start, rm, H, head, m_ok)
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for n0 in range(0, length, BLOCK_N):
            rn = n0 + tl.arange(0, BLOCK_N)
            n_ok = rn < length
            k = _tile(K, base, rn, rd, n_ok, d_ok, stride_n)
            v = _tile(V, base, rn, rd, n_ok, d_ok, stride_n)
            p = _probs(q, k, lse, m_ok, n_ok, scale, PREC)
            ds = _score_grads(p, do, v, delta, PREC)
            dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
        _store_tile(DQ, dq * scale, base, rm, rd, m_ok, d_ok, stride_n)


def _launch_args(q: torch.Tensor, max_len: int) -> dict[str, Any]:
    bd = block(q.shape[-1])
    bm = 16 if max_len <= 16 else 32
    return {"BLOCK_M": bm, "BLOCK_N": bm, "BLOCK_D": bd,
            "PREC": "ieee" if q.dtype == torch.float32 else "tf32"}


class _JaggedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor,
                max_len: int) -> torch.Tensor:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        n, h, dh = q.shape
        rows = offsets.numel() - 1
        o = torch.empty_like(q)
        lse = torch.empty(n, h, dtype=torch.float32, device=q.device)
        kw = _launch_args(q, max_len)
        scale = 1.0 / math.sqrt(dh)
        if n and rows and max_len:
            grid = (triton.cdiv(max_len, kw["BLOCK_M"]), rows, h)
            _fwd[grid](q, k, v, o, lse, offsets, scale, q.stride(0), q.stride(1), h, dh, **kw)
        ctx.save_for_backward(q, k, v, o, lse, offsets)
        ctx.max_len = max_len
        return o

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, o, lse, offsets = ctx.saved_tensors
        do = do.contiguous()
        n, h, dh = q.shape
        rows = offsets.numel() - 1
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        delta = (do.float() * o.float()).sum(-1).contiguous()  # [N, H]: rowsum(dO * O)
        kw = _launch_args(q, ctx.max_len)
        scale = 1.0 / math.sqrt(dh)
        if n and rows and ctx.max_len:
            args = (q.stride(0), q.stride(1), h, dh)
            _bwd_dkdv[(triton.cdiv(ctx.max_len, kw["BLOCK_N"]), rows, h)](
                q, k, v, do, lse, delta, dk, dv, offsets, scale, *args, **kw)
            _bwd_dq[(triton.cdiv(ctx.max_len, kw["BLOCK_M"]), rows, h)](
                q, k, v, do, lse, delta, dq, offsets, scale, *args, **kw)
        return dq, dk, dv, None, None


def jagged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor,
                     max_len: int) -> torch.Tensor:
    """softmax(q kᵀ / √dh) v within each row of packed [N, H, dh] events -> [N, H, dh]."""
    return _JaggedAttention.apply(q, k, v, offsets.to(torch.int64).contiguous(), int(max_len))
