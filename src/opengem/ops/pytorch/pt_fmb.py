"""Reference Wukong FMB and layer combine: the layer's original computation, op by op.

Kept as the twin the fused kernels in :mod:`opengem.ops.fused.fused_fmb` are tested against: einsum for
the token-axis products, an explicit ``cat`` of the FMB and LCB tokens, the residual added after it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def fm_product(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """X · (Xᵀ Y) -> [B, n, k]; y is a shared [n, k] or a per-example [B, n, k]."""
    if y.dim() == 3:
        return torch.bmm(x, torch.bmm(x.transpose(1, 2), y))
    return torch.bmm(x, torch.einsum("bnd,nk->bdk", x, y))


def fmb(
    x: torch.Tensor,
    y: torch.Tensor,
    ln_weight: torch.Tensor,
    ln_bias: torch.Tensor,
    weights: list[torch.Tensor],
    biases: list[torch.Tensor],
    eps: float,
) -> torch.Tensor:
    """MLP(LN(flatten(X · (Xᵀ Y)))) -> [B, out]: ReLU between the MLP's layers, none after the last."""
    h = fm_product(x, y).flatten(1)
    h = F.layer_norm(h, (h.shape[1],), ln_weight, ln_bias, eps)
    for i, (w, b) in enumerate(zip(weights, biases)):
        h = F.linear(h, w, b)
        if i < len(weights) - 1:
            h = F.relu(h)
    return h


def combine(
    fmb_tokens: torch.Tensor,
    x: torch.Tensor,
    w_lin: torch.Tensor,
    w_res: torch.Tensor | None,
    ln_weight: torch.Tensor | None,
    ln_bias: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    """LN(concat(FMB, W_L·X) + residual(X)) -> [B, nF + nL, d]; residual = X, or W_R·X when given; no LN
    when ``ln_weight`` is None."""
    lcb = torch.einsum("ln,bnd->bld", w_lin, x)
    res = x if w_res is None else torch.einsum("mn,bnd->bmd", w_res, x)
    out = torch.cat([fmb_tokens, lcb], dim=1) + res
    if ln_weight is None:
        return out
    return F.layer_norm(out, (out.shape[2],), ln_weight, ln_bias, eps)
