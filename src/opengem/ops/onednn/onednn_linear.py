"""``linear`` forward and backward as three oneDNN matrix products (``torch.ops.mkldnn._linear_pointwise``).

``_linear_pointwise(a, w, bias, "none", [], "")`` computes ``a @ w.T + bias`` for a strided fp32 ``a``
[M, K] and ``w`` [N, K]; it takes transposed views too, but copies them to contiguous first (the reason dW
sometimes goes to ``mm``, see the backward). The three products of a dense layer map onto it as:
y = x W^T + b; dx = dy W, i.e. ``w = W^T``; dW = dy^T x, i.e. ``a = dy^T``, ``w = x^T``; db is a column sum.
Inputs with more than two dims are flattened to rows first.

It is the op Inductor itself emits for CPU linears when MKL is absent, not a public API: :func:`available`
checks that this torch has it, and the dispatcher in ``opengem.ops.linear`` refuses ``kernel="onednn"``
where it does not (never a silent fallback to the reference).
"""

from __future__ import annotations

import torch

DW_MAX_ROWS_PER_WIDTH = 64  # dW by oneDNN while rows <= 64 x the wider weight dim (see backward)
DW_MIN_WEIGHT = 1 << 14  # ... and the weight has at least this many entries


def available() -> bool:
    """True when this torch has oneDNN (mkldnn) with the fp32 linear op."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _mm_t(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ w.T (+ bias)`` for 2-D fp32 CPU tensors, by oneDNN; an empty operand (oneDNN has no primitive
    for zero rows) goes to aten, where the product is free anyway."""
    if a.numel() == 0 or w.numel() == 0:
        return torch.nn.functional.linear(a, w, bias)
    return torch.ops.mkldnn._linear_pointwise(a, w, bias, "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None  # noqa: ANN001
                ) -> torch.Tensor:
        ctx.save_for_backward(x2, weight)
        ctx.has_bias = bias is not None
        return _mm_t(x2, weight, bias)

    @staticmethod
    def backward(ctx, dy: torch.Tensor  # noqa: ANN001
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        x2, weight = ctx.saved_tensors
        dy2 = dy.contiguous()
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = _mm_t(dy2, weight.t())
        if ctx.needs_input_grad[1]:
            rows, (n_out, n_in) = x2.shape[0], weight.shape
            # dW = dy^T x reduces over the rows. PyTorch's oneDNN op copies both transposed operands first,
            # which costs more than oneDNN saves when the reduction is long beside a small weight (measured,
            # one thread: 32768 rows x 32 x 32 oneDNN 1.5 ms vs MKL's mm 1.0; 4096 x 400 x 1 0.11 vs 0.08;
            # 4096 x 164 x 164 1.9 vs 2.8; 512 x 192 x 512 0.61 vs 1.20): such shapes go to mm.
            long = rows > DW_MAX_ROWS_PER_WIDTH * max(n_out, n_in) or n_out * n_in < DW_MIN_WEIGHT
            dw = (torch.mm(dy2.t(), x2) if long
                  else _mm_t(dy2.t(), x2.t()))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.sum(0)
        return dx, dw, db


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` (fp32, CPU) with oneDNN's products forward and backward. The Function sees 2-D
    tensors only: its output is then never a view, so an in-place op after it (a ReLU) is allowed."""
    y = _OneDNNLinear.apply(x.reshape(-1, x.shape[-1]), weight, bias)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], weight.shape[0])
