"""Wukong's FM product X·(XᵀY) and the LayerNorm after it, fused in one Triton kernel per direction.

One program owns one example: it loads X [n, d] and Y [n, k] once, forms Z = XᵀY [d, k] and F = X·Z [n, k]
in registers, and (for the FMB) normalises F over its n·k values and applies the affine LN, so neither Z,
F nor the normalised values ever reach memory; the forward keeps only each example's mean and 1/σ. The
backward recomputes Z, F and the normalised values from X, Y and those two numbers, and writes dX and
per-example dY and dγ (summed over the batch afterwards when Y or γ is shared); dβ is the batch sum of
the upstream gradient. The MLP after the LayerNorm is dense GEMMs (cuBLAS): :func:`opengem.ops.fmb.fmb`
runs it around this kernel.

An example's tiles must fit one program (next_pow2(n) x next_pow2(max(d, k)) <= 16,384 values: GEM's FMB
is 24-64 tokens of d <= 128); larger inputs are an error naming the limit. fp32 inputs multiply in IEEE
fp32 (not TF32). Reference: :mod:`opengem.ops.pytorch.pt_fmb`.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from opengem.ops.triton import block

MAX_TILE = 16384  # values per [n, d] / [n, k] tile one program holds


@triton.jit
def _fm_fwd(X, Y, LW, LB, OUT, MEAN, RSTD, N, D, K, sxb, syb, eps,
            BN: tl.constexpr, BD: tl.constexpr, BK: tl.constexpr, HAS_LN: tl.constexpr, PREC: tl.constexpr):
    b = tl.program_id(0)
    rn, rd, rk = tl.arange(0, BN), tl.arange(0, BD), tl.arange(0, BK)
    n_ok, d_ok, k_ok = rn < N, rd < D, rk < K
    x = tl.load(X + b * sxb + rn[:, None] * D + rd[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)
    nk_mask = n_ok[:, None] & k_ok[None, :]
    y = tl.load(Y + b * syb + rn[:, None] * K + rk[None, :], mask=nk_mask, other=0.0)
    z = tl.dot(tl.trans(x), y, input_precision=PREC)  # [BD, BK]
    f = tl.dot(x, z.to(x.dtype), input_precision=PREC)  # [BN, BK], fp32
    idx = rn[:, None] * K + rk[None, :]
    if HAS_LN:
        count = N * K
        mean = tl.sum(tl.sum(f, 1), 0) / count
        diff = tl.where(nk_mask, f - mean, 0.0)
        var = tl.sum(tl.sum(diff * diff, 1), 0) / count
        rstd = 1.0 / tl.sqrt(var + eps)
        w = tl.load(LW + idx, mask=nk_mask, other=0.0).to(tl.float32)
        bias = tl.load(LB + idx, mask=nk_mask, other=0.0).to(tl.float32)
        f = diff * rstd * w + bias
        tl.store(MEAN + b, mean)
        tl.store(RSTD + b, rstd)
    tl.store(OUT + b * N * K + idx, f.to(OUT.dtype.element_ty), mask=nk_mask)


@triton.jit
def _fm_bwd(X, Y, LW, G, MEAN, RSTD, DX, DY, DLW, N, D, K, sxb, syb,
            BN: tl.constexpr, BD: tl.constexpr, BK: tl.constexpr, HAS_LN: tl.constexpr, PREC: tl.constexpr):
    b = tl.program_id(0)
    rn, rd, rk = tl.arange(0, BN), tl.arange(0, BD), tl.arange(0, BK)
    n_ok, d_ok, k_ok = rn < N, rd < D, rk < K
    nd_mask = n_ok[:, None] & d_ok[None, :]
    nk_mask = n_ok[:, None] & k_ok[None, :]
    idx = rn[:, None] * K + rk[None, :]
    x = tl.load(X + b * sxb + rn[:, None] * D + rd[None, :], mask=nd_mask, other=0.0)
    y = tl.load(Y + b * syb + rn[:, None] * K + rk[None, :], mask=nk_mask, other=0.0)
    g = tl.load(G + b * N * K + idx, mask=nk_mask, other=0.0).to(tl.float32)
    z = tl.dot(tl.trans(x), y, input_precision=PREC)  # [BD, BK]
    if HAS_LN:
        f = tl.dot(x, z.to(x.dtype), input_precision=PREC)
        mean = tl.load(MEAN + b)
        rstd = tl.load(RSTD + b)
        xhat = tl.where(nk_mask, (f - mean) * rstd, 0.0)
        w = tl.load(LW + idx, mask=nk_mask, other=0.0).to(tl.float32)
        tl.store(DLW + b * N * K + idx, (g * xhat).to(DLW.dtype.element_ty), mask=nk_mask)
        gw = g * w
        count = N * K
        m1 = tl.sum(tl.sum(gw, 1), 0) / count
        m2 = tl.sum(tl.sum(gw * xhat, 1), 0) / count
        g = tl.where(nk_mask, rstd * (gw - m1 - xhat * m2), 0.0)  # dL/dF
    gx = g.to(x.dtype)
    wt = tl.dot(tl.trans(x), gx, input_precision=PREC)  # Xᵀ dF [BD, BK]
    dx = tl.dot(gx, tl.trans(z.to(x.dtype)), input_precision=PREC)
    dx += tl.dot(y, tl.trans(wt.to(x.dtype)), input_precision=PREC)
    dy = tl.dot(x, wt.to(x.dtype), input_precision=PREC)
    tl.store(DX + b * N * D + rn[:, None] * D + rd[None, :], dx.to(DX.dtype.element_ty), mask=nd_mask)
    tl.store(DY + b * N * K + idx, dy.to(DY.dtype.element_ty), mask=nk_mask)


def _tiles(n: int, d: int, k: int, dtype: torch.dtype) -> dict[str, Any]:
    bn, bd, bk = block(n), block(d), block(k)
    if bn * max(bd, bk) > MAX_TILE:
        raise ValueError(f"triton fm product: an example's [{n}, {d}] x [{n}, {k}] tiles exceed one "
                         f"program's {MAX_TILE} values (use kernel='fused')")
    return {"BN": bn, "BD": bd, "BK": bk, "PREC": "ieee" if dtype == torch.float32 else "tf32"}


class _FmLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor, lw: torch.Tensor | None, lb: torch.Tensor | None,
                eps: float) -> torch.Tensor:
        x, y = x.contiguous(), y.to(x.dtype).contiguous()
        B, n, d = x.shape
        k = y.shape[-1]
        has_ln = lw is not None
        kw = _tiles(n, d, k, x.dtype)
        out = torch.empty(B, n, k, dtype=x.dtype, device=x.device)
        mean = torch.empty(B, dtype=torch.float32, device=x.device)
        rstd = torch.empty_like(mean)
        lw_c = lw.contiguous() if has_ln else out  # unread when HAS_LN is off
        lb_c = lb.contiguous() if lb is not None else lw_c
        syb = n * k if y.dim() == 3 else 0
        if B:
            _fm_fwd[(B,)](x, y, lw_c, lb_c, out, mean, rstd, n, d, k, n * d, syb, float(eps), HAS_LN=has_ln,
                          **kw)
        ctx.save_for_backward(x, y, lw_c, mean, rstd)
        ctx.has_ln, ctx.y_dim, ctx.y_dtype = has_ln, y.dim(), y.dtype
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, y, lw, mean, rstd = ctx.saved_tensors
        g = g.contiguous()
        B, n, d = x.shape
        k = y.shape[-1]
        kw = _tiles(n, d, k, x.dtype)
        dx = torch.empty_like(x)
        dy = torch.empty(B, n, k, dtype=x.dtype, device=x.device)
        dlw = torch.empty(B, n, k, dtype=torch.float32, device=x.device) if ctx.has_ln else dy
        syb = n * k if ctx.y_dim == 3 else 0
        if B:
            _fm_bwd[(B,)](x, y, lw, g, mean, rstd, dx, dy, dlw, n, d, k, n * d, syb, HAS_LN=ctx.has_ln,
                          **kw)
        else:
            dy.zero_()
            dlw.zero_()
        dy_out = (dy if ctx.y_dim == 3 else dy.sum(0)).to(ctx.y_dtype)
        if not ctx.has_ln:
            return dx, dy_out, None, None, None
        dlw_out = dlw.sum(0).reshape(-1).to(lw.dtype)
        dlb_out = g.sum(0).reshape(-1).to(lw.dtype)
        return dx, dy_out, dlw_out, dlb_out, None


def fm_product(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """X · (Xᵀ Y) -> [B, n, k]; y is a shared [n, k] or a per-example [B, n, k]."""
    return _FmLayerNorm.apply(x, y, None, None, 0.0)


def fm_layer_norm(x: torch.Tensor, y: torch.Tensor, ln_weight: torch.Tensor, ln_bias: torch.Tensor,
                  eps: float) -> torch.Tensor:
    """LN(flatten(X · (Xᵀ Y))) -> [B, n·k], LN over each example's n·k values with affine [n·k]."""
    return _FmLayerNorm.apply(x, y, ln_weight, ln_bias, eps).flatten(1)
