"""Fused per-(surface, task) head: the whole batch through one matrix product per layer, no weight copies.

The reference (:mod:`opengem.ops.pytorch.pt_surface_head`) gathers a copy of the weights per example and
multiplies example by example: 55-66 ms of a ~247 ms DCNv2 step at batch 4096 (issue 13). Here the
surfaces' weights are laid side by side:

- down:  ``relu(h [A_0 | ... | A_{S-1}] + a)`` -> [B, S, a]; the other surfaces' blocks are zeroed by
  the example's one-hot surface, so they carry neither value nor gradient;
- up:    that block-sparse [B, S·a] times ``[U_0; ...; U_{S-1}]`` [S·a, H] is exactly ``z U_s``;
- out:   ``h' [W_0 | ... | W_{S-1}] + b`` -> [B, S, T], and each example keeps its own surface's T logits.

Why not sort examples by surface and multiply group by group: that needs the group sizes on the host (a
device sync, a graph break under torch.compile, data-dependent shapes under FX tracing) and was no faster
for S <= 8 on CPU. The price of the dense form is S x the head's own FLOPs; with S <= 8 and a head of a
few thousand FLOPs per example that is far below the trunk, and :func:`discarded_flops_per_example`
states it, so FLOP counts can tell useful from executed work.
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
    # sizes by index, not tuple unpacking: under torch.fx symbolic tracing (TorchRec's train pipelines)
    # a shape is a Proxy, which can be indexed but not iterated
    B, H = h.shape[0], h.shape[1]
    S, T = out_weight.shape[0], out_weight.shape[2]
    # one-hot by comparison, not F.one_hot: that checks the range on the host (a device sync per step)
    own = (surface[:, None] == torch.arange(S, device=surface.device)).to(h.dtype)  # [B, S]
    if adapter_down is not None:
        a = adapter_down.shape[2]
        down = adapter_down.permute(1, 0, 2).reshape(H, S * a)
        z = F.relu(torch.addmm(adapter_down_bias.reshape(1, S * a), h, down)).view(B, S, a)
        h = h + (z * own[:, :, None]).view(B, S * a) @ adapter_up.reshape(S * a, H)
    out = torch.addmm(out_bias.reshape(1, S * T), h, out_weight.permute(1, 0, 2).reshape(H, S * T))
    return out.view(B, S, T).gather(1, surface.view(B, 1, 1).expand(B, 1, T)).squeeze(1)


def discarded_flops_per_example(hidden: int, adapter_dim: int, num_tasks: int, num_surfaces: int) -> int:
    """FLOPs :func:`surface_head` computes per example for the S-1 surfaces that are not the example's own.

    Down and out layers: (S-1) x (2·H·a + 2·H·T). The up product multiplies S·a inputs of which (S-1)·a are
    zero: (S-1) x 2·a·H more. FlopCounterMode counts all of them; model FLOPs (MFU's numerator) do not.
    """
    per_surface = 2 * hidden * adapter_dim * 2 + 2 * hidden * num_tasks
    return (num_surfaces - 1) * per_surface
