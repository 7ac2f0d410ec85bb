"""Per-(surface, task) output head, the op every opengem model ends with.

Each example has one surface s and is scored by that surface's small residual adapter (A_s [H, a], bias
a_s, U_s [a, H]) and output layer (W_s [H, T], b_s [T]). ``kernel`` (see :mod:`opengem.ops.kernel`):
``pytorch`` runs :mod:`opengem.ops.pytorch.pt_surface_head` (a weight copy per example, example by
example: the reference); ``fused`` runs :mod:`opengem.ops.fused.fused_surface_head` (one matrix product
per layer for the whole batch: 4-7x faster fwd+bwd at batch 4096, the default of every model's head).
"""

from __future__ import annotations

import torch

from opengem.ops.fused import fused_surface_head
from opengem.ops.fused.fused_surface_head import discarded_flops_per_example
from opengem.ops.kernel import WITH_FUSED, Kernel, resolve_kernel
from opengem.ops.pytorch import pt_surface_head

__all__ = ["discarded_flops_per_example", "surface_head"]


def surface_head(
    h: torch.Tensor,
    surface: torch.Tensor,
    out_weight: torch.Tensor,
    out_bias: torch.Tensor,
    adapter_down: torch.Tensor | None = None,
    adapter_down_bias: torch.Tensor | None = None,
    adapter_up: torch.Tensor | None = None,
    *,
    kernel: Kernel | str = Kernel.FUSED,
) -> torch.Tensor:
    """Logits [B, T] of each example's own surface: ``(h + relu(h A_s + a_s) U_s) W_s + b_s``.

    h [B, H]; surface [B] int in [0, S) (not checked here: the head checks it once, outside compile);
    out_weight [S, H, T], out_bias [S, T]; the adapter (all three or none) adapter_down [S, H, a],
    adapter_down_bias [S, a], adapter_up [S, a, H]. The fused kernel also computes the other surfaces'
    products and drops them: :func:`discarded_flops_per_example` says how many FLOPs that is.
    """
    k = resolve_kernel(kernel, WITH_FUSED)
    adapter = (adapter_down, adapter_down_bias, adapter_up)
    if any(p is None for p in adapter) and any(p is not None for p in adapter):
        raise ValueError("surface_head: give all three adapter tensors or none")
    if k == Kernel.PYTORCH:
        return pt_surface_head.surface_head(h, surface, out_weight, out_bias, *adapter)
    return fused_surface_head.surface_head(h, surface, out_weight, out_bias, *adapter)
