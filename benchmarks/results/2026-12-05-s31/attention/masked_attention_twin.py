"""(Tried in session 31, not adopted: README.md here.) A twin of the masked attention core on CPU: two
batched products and a softmax, gradients in the layout the projections want.

Why: GEM's attention is many tiny problems (512 rows x 2 heads of 2-64 tokens, head width 16). There
SDPA's CPU flash kernel pays its tiling machinery per (row, head) block and zero-fills its gradients, and
it hands back gradients in its own layout: the K/V projections' backward products then read strided
[B·L, d] operands (measured in GEM-small's step: the pooling's [32768, 32] x [32, 32] input-gradient
product at 17 GFLOP/s, against ~60 for the same shape contiguous). Here the scores are one ``bmm`` over
(row, head), the mask an additive -inf bias, the softmax and its backward PyTorch's fused kernels
(``_softmax_backward_data`` is p * (dp - Σ p·dp) in one pass), and every gradient is written straight into
the memory layout of its input (the token-major projection output the callers view head-major), so the
chain view -> transpose -> linear runs backward with no further copy.

The price: the probabilities [B, H, Lq, Lk] are kept for backward (flash keeps only a log-sum-exp), which
at GEM's lengths (<= 64 keys) is the size of a few activations. Off CPU (CUDA) the op is the reference's
SDPA: the GPU's flash kernels are the fast path there. Same math as the reference, including a row with
no real key attending to its first slot; tests pin forward and backward equality.
"""

from __future__ import annotations

import torch

from opengem.ops.pytorch import pt_attention


def _key_bias(key_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, Lk] additive bias: 0 on real keys (and on slot 0 of an empty row), -inf elsewhere."""
    keep = pt_attention.safe_key_mask(key_mask)
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, float("-inf"))


def _in_layout(layout: tuple[torch.Size, tuple[int, ...]], value: torch.Tensor) -> torch.Tensor:
    """``value`` copied into memory with the (shape, strides) ``layout`` of the input it is the grad of."""
    shape, strides = layout
    out = torch.empty_strided(shape, strides, dtype=value.dtype, device=value.device)
    return out.copy_(value.view(shape))


class _MaskedAttention(torch.autograd.Function):
    """softmax(q kᵀ / √dh + bias) v over [B, H, L, dh] views (any dense strides), fp32, autocast off."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,  # noqa: ANN001
                bias: torch.Tensor | None) -> torch.Tensor:
        B, H, Lq, dh = q.shape
        Lk = k.shape[2]
        scale = dh ** -0.5
        qs = torch.mul(q, scale, out=q.new_empty(B, H, Lq, dh)).view(B * H, Lq, dh)  # scale + layout at once
        kh = k.contiguous().view(B * H, Lk, dh)
        vh = v.contiguous().view(B * H, Lk, dh)
        s = torch.bmm(qs, kh.transpose(1, 2))
        if bias is not None:
            s.view(B, H, Lq, Lk).add_(bias[:, None, None, :])
        p = torch.softmax(s, dim=-1)
        o = torch.bmm(p, vh).view(B, H, Lq, dh)
        ctx.save_for_backward(qs, kh, vh, p)
        ctx.scale = scale
        ctx.layouts = [(t.shape, t.stride()) for t in (q, k, v)]  # each grad is written in its input's layout
        return o

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        qs, kh, vh, p = ctx.saved_tensors
        lq, lk, lv = ctx.layouts
        B, H, Lq, dh = grad.shape
        with torch.autocast("cpu", enabled=False):
            g = grad.contiguous().view(B * H, Lq, dh)
            dv = torch.bmm(p.transpose(1, 2), g)
            dp = torch.bmm(g, vh.transpose(1, 2))
            ds = torch._softmax_backward_data(dp, p, -1, p.dtype)
            dq = torch.bmm(ds, kh).mul_(ctx.scale)
            dk = torch.bmm(ds.transpose(1, 2), qs)  # qs carries the scale already
        return _in_layout(lq, dq), _in_layout(lk, dk), _in_layout(lv, dv), None


def masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None
) -> torch.Tensor:
    """Same contract as :func:`opengem.ops.pytorch.pt_attention.masked_attention` ([B, H, Lq, dh] out)."""
    if q.device.type != "cpu":
        return pt_attention.masked_attention(q, k, v, key_mask)
    dtype = q.dtype
    with torch.autocast("cpu", enabled=False):  # fp32 core, as the reference's (see pt_attention)
        q, k, v = (t.float() for t in (q, k, v))
        bias = None if key_mask is None else _key_bias(key_mask, q.dtype)
        o = _MaskedAttention.apply(q, k, v, bias)
    return o.to(dtype)

