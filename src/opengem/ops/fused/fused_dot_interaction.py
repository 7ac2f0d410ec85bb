"""Pairwise dot interaction as n - 1 broadcast products summed over d: one loop once compiled.

Why a second form of the same sums: in a compiled or exported graph (AOTInductor, ``torch.compile``) the
reference's ``bmm`` is a library call on B tiny n x n products and its triangle gather a second kernel.
Here vector i meets every later vector at once (``x[:, i:i+1] * x[:, i+1:]``, summed over d), so the
pairs come out in the reference's order with no Gram matrix, no index tensor and no gather, and the
compiler fuses the n - 1 slices into one loop over the batch. On the vertical model of
``configs/transfer.toml`` (8 vectors of width 8) under AOTInductor: see
``benchmarks/results/2026-12-07-s53/dot_interaction/``. Eager PyTorch runs this form slower than the
reference (n - 1 small products instead of one), so only exported graphs use it
(:func:`opengem.ops.kernel.inductor_kernel`).
"""

from __future__ import annotations

import torch


def dot_interaction(x: torch.Tensor) -> torch.Tensor:
    """[B, n(n-1)/2]: ``<x[:, i], x[:, j]>`` for every i < j, in ``torch.triu_indices(n, n, 1)`` order."""
    n = x.shape[1]
    if n < 2:
        return x.new_zeros(x.shape[0], 0)
    return torch.cat([(x[:, i:i + 1] * x[:, i + 1:]).sum(-1) for i in range(n - 1)], dim=1)
