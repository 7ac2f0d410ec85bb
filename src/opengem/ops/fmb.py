"""Wukong's Factorization Machine Block and the layer combine around it (arXiv 2403.02545).

``fmb``: ``MLP(LN(flatten(X · (Xᵀ Y))))``, the optimized FM (Y of rank k ≪ n, so O(n·d·k)) then the MLP;
``combine``: ``LN(concat(FMB, LCB) + residual)`` with LCB = W_L·X along the token axis and the residual X or
W_R·X. ``kernel`` (see :mod:`opengem.ops.kernel`): ``pytorch`` runs :mod:`opengem.ops.pytorch.pt_fmb` (the
reference), ``fused`` :mod:`opengem.ops.fused.fused_fmb` (no layout copies, no cat, LCB and residual in
one product); ``fm_product`` and ``fmb`` also have ``triton`` (:mod:`opengem.ops.triton.triton_fmb`: the FM
product and the LayerNorm in one GPU kernel per example, the MLP as GEMMs; ``combine`` has no Triton
kernel). Parameters live in ``opengem.model.wukong.WukongLayer``; these ops only compute.
"""

from __future__ import annotations

import torch

from opengem.ops.fused import fused_fmb
from opengem.ops.kernel import WITH_FUSED, WITH_FUSED_AND_TRITON, Kernel, resolve_kernel
from opengem.ops.pytorch import pt_fmb
from opengem.ops.triton import kernels as triton_kernels


def fm_product(x: torch.Tensor, y: torch.Tensor, *, kernel: Kernel | str = Kernel.PYTORCH) -> torch.Tensor:
    """X · (Xᵀ Y) -> [B, n, k] for x [B, n, d] and y [n, k] (shared) or [B, n, k] (input-attentive)."""
    which = resolve_kernel(kernel, WITH_FUSED_AND_TRITON)
    if which is Kernel.TRITON:
        return triton_kernels("triton_fmb", x, y).fm_product(x, y)
    if which is Kernel.FUSED:
        return fused_fmb.fm_product(x, y)
    return pt_fmb.fm_product(x, y)


def fmb(
    x: torch.Tensor,
    y: torch.Tensor,
    ln_weight: torch.Tensor,
    ln_bias: torch.Tensor,
    weights: list[torch.Tensor],
    biases: list[torch.Tensor],
    eps: float = 1e-5,
    *,
    kernel: Kernel | str = Kernel.PYTORCH,
    linear_kernel: Kernel | str = Kernel.PYTORCH,
) -> torch.Tensor:
    """FMB output [B, out] = MLP(LN(flatten(X · (Xᵀ Y)))), ReLU between MLP layers (``weights[i]`` is
    [out_i, in_i] as in ``nn.Linear``); reshape it to [B, nF, d] for :func:`combine`. ``linear_kernel``
    (:mod:`opengem.ops.linear`) runs the MLP's products of the fused and Triton kernels; the reference
    always uses ``F.linear``."""
    if len(weights) != len(biases) or not weights:
        raise ValueError(f"fmb: need one bias per MLP weight and at least one layer "
                         f"(got {len(weights)} weights, {len(biases)} biases)")
    which = resolve_kernel(kernel, WITH_FUSED_AND_TRITON)
    if which is Kernel.TRITON:
        fused_ln = triton_kernels("triton_fmb", x, y, ln_weight, ln_bias).fm_layer_norm
        h = fused_ln(x, y, ln_weight, ln_bias, eps)
        return fused_fmb.mlp(h, weights, biases, linear_kernel)
    if which is Kernel.FUSED:
        return fused_fmb.fmb(x, y, ln_weight, ln_bias, weights, biases, eps, linear_kernel)
    return pt_fmb.fmb(x, y, ln_weight, ln_bias, weights, biases, eps)


def combine(
    fmb_tokens: torch.Tensor,
    x: torch.Tensor,
    w_lin: torch.Tensor,
    w_res: torch.Tensor | None,
    ln_weight: torch.Tensor | None,
    ln_bias: torch.Tensor | None,
    eps: float = 1e-5,
    *,
    kernel: Kernel | str = Kernel.PYTORCH,
) -> torch.Tensor:
    """A Wukong layer's output [B, nF + nL, d] = LN(concat(FMB, W_L·X) + residual(X)), or the sum without
    the LN when ``ln_weight`` is None (``wukong.norm = "none"``).

    fmb_tokens [B, nF, d]; x [B, n, d]; w_lin [nL, n]; w_res [nF + nL, n], or None for the identity
    residual (then nF + nL must equal n).
    """
    n_out = fmb_tokens.shape[1] + w_lin.shape[0]
    if w_res is None and n_out != x.shape[1]:
        raise ValueError(f"combine: identity residual needs nF + nL = n (got {n_out} vs {x.shape[1]})")
    if resolve_kernel(kernel, WITH_FUSED) is Kernel.FUSED:
        return fused_fmb.combine(fmb_tokens, x, w_lin, w_res, ln_weight, ln_bias, eps)
    return pt_fmb.combine(fmb_tokens, x, w_lin, w_res, ln_weight, ln_bias, eps)
