"""Fused Wukong FMB and layer combine: fewer, larger ops with no layout copies.

Why: the reference (:mod:`opengem.ops.pytorch.pt_fmb`) forms ``Xᵀ Y`` with an einsum that permutes X into
a copy, mixes tokens with two more einsums (LCB and the residual, each a permute-copy in and out), and
joins FMB and LCB tokens with a ``cat`` before adding the residual. Here:

- ``Xᵀ Y`` is one batched product on X as it lies (Y repeated per example), not a permuted copy of X;
- LCB and residual are ONE token-mixing weight ``W_C = [W_R,top ; W_L + W_R,bottom]`` (an identity residual
  is the identity matrix), applied in one batched product that also adds the FMB tokens
  (``baddbmm`` onto the FMB tokens padded with nL zero tokens), so no ``cat`` and no separate add;
- the MLP runs as ``addmm`` with in-place ReLU.

Same math as the reference up to fp32 rounding (the tests pin forward and backward equality). Under CPU
autocast the two thin batched products (``fm_product``, ``combine``) run in fp32 and only the MLP in bf16
(see :mod:`opengem.ops.cpu_autocast`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from opengem.ops.cpu_autocast import fp32_under_cpu_autocast
from opengem.ops.kernel import Kernel
from opengem.ops.linear import kernel_for, linear


@fp32_under_cpu_autocast
def fm_product(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """X · (Xᵀ Y) -> [B, n, k]; y is a shared [n, k] or a per-example [B, n, k]."""
    if y.dim() == 2:
        # one Y per example, materialised ([B, n, k] is small): autograd saves it for bmm's backward, and a
        # saved stride-0 view breaks saved-tensor hooks that rebuild it with its strides (train.memory's fp8)
        y = y.expand(x.shape[0], *y.shape).contiguous()
    return torch.bmm(x, torch.bmm(x.transpose(1, 2), y))


def fmb(
    x: torch.Tensor,
    y: torch.Tensor,
    ln_weight: torch.Tensor,
    ln_bias: torch.Tensor,
    weights: list[torch.Tensor],
    biases: list[torch.Tensor],
    eps: float,
    linear_kernel: Kernel | str = Kernel.PYTORCH,
) -> torch.Tensor:
    """MLP(LN(flatten(X · (Xᵀ Y)))) -> [B, out]: ReLU between the MLP's layers, none after the last."""
    h = fm_product(x, y).flatten(1)
    return mlp(F.layer_norm(h, (h.shape[1],), ln_weight, ln_bias, eps), weights, biases, linear_kernel)


def mlp(h: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor],
        linear_kernel: Kernel | str = Kernel.PYTORCH) -> torch.Tensor:
    """The FMB's MLP on [B, in]: one addmm per layer, ReLU in place between layers, none after the last.
    (``F.linear`` of a 2-D input is that addmm.) ``linear_kernel="onednn"``: each layer that
    :func:`~opengem.ops.linear.kernel_for` lets through runs through oneDNN instead (``train.cpu_linear``)."""
    last = len(weights) - 1
    for i, (w, b) in enumerate(zip(weights, biases)):
        h = linear(h, w, b, kernel=kernel_for(linear_kernel, h, w))
        if i < last:
            h = h.relu_()  # ReLU's backward reads its output, so in place is safe and saves a buffer
    return h


def mixing_weight(n_fm: int, w_lin: torch.Tensor, w_res: torch.Tensor | None) -> torch.Tensor:
    """``W_C`` [nF + nL, n]: rows of the residual map, with W_L added to the rows of the LCB tokens."""
    n = w_lin.shape[1]
    if w_res is None:
        w_res = torch.eye(n, dtype=w_lin.dtype, device=w_lin.device)
    return torch.cat([w_res[:n_fm], w_res[n_fm:] + w_lin], dim=0)


@fp32_under_cpu_autocast
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
    B, n_fm = x.shape[0], fmb_tokens.shape[1]
    w_c = mixing_weight(n_fm, w_lin, w_res)
    padded = F.pad(fmb_tokens, (0, 0, 0, w_lin.shape[0]))
    out = torch.baddbmm(padded, w_c.expand(B, *w_c.shape).contiguous(), x)  # contiguous: as Y above
    if ln_weight is None:
        return out
    return F.layer_norm(out, (out.shape[2],), ln_weight, ln_bias, eps)
