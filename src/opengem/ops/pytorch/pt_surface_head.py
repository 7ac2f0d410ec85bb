"""Reference per-(surface, task) head: every example gathers its own surface's weights and multiplies alone.

This is the head's original computation, kept as the twin the fast op in :mod:`opengem.ops.surface_head`
is tested against: it is obviously right (one example, one surface, one small product) and obviously slow
(a [B, H, n] copy of the weights per layer and a batched product of B tiny matrices, with a scatter-add of
B weight copies in the backward).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def surface_head(
    h: torch.Tensor,
    surface: torch.Tensor,
    out_weight: torch.Tensor,
    out_bias: torch.Tensor,
    adapter_down: torch.Tensor | None = None,
    adapter_down_bias: torch.Tensor | None = None,
    adapter_up: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits [B, T] of each example's own surface: ``(h + relu(h A_s + a_s) U_s) W_s + b_s``."""
    x = h[:, None, :]  # [B, 1, H]
    if adapter_down is not None:
        z = F.relu(torch.bmm(x, adapter_down[surface]) + adapter_down_bias[surface][:, None, :])
        x = x + torch.bmm(z, adapter_up[surface])
    return torch.bmm(x, out_weight[surface]).squeeze(1) + out_bias[surface]
