"""Test helpers for kernel twins (a reference op and its fused variant): seeded random tensors, and one
forward + backward under a fixed random upstream gradient."""

from __future__ import annotations

from collections.abc import Callable

import torch


def rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def run_fwd_bwd(fn: Callable[..., torch.Tensor], inputs: list, seed: int = 7
                ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """Output and the gradient of every tensor input (None stays None) under a random upstream gradient."""
    leaves = [None if x is None else x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    (out * rand(*out.shape, seed=seed)).sum().backward()
    return out.detach(), [None if x is None else x.grad for x in leaves]
