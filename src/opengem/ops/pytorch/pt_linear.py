"""Reference dense layer: ``torch.nn.functional.linear`` (on CPU in fp32, PyTorch's BLAS: MKL's sgemm)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias``: x [..., in], weight [out, in], bias [out] or None."""
    return F.linear(x, weight, bias)
