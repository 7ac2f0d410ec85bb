"""DLRM's pairwise dot interaction: for each row's n vectors, the dot product of every pair i < j.

``kernel`` (see :mod:`opengem.ops.kernel`): ``pytorch`` runs :mod:`opengem.ops.pytorch.pt_dot_interaction`
(Gram matrix by ``bmm``, triangle gathered: the reference, and the fastest form in eager PyTorch);
``fused`` runs :mod:`opengem.ops.fused.fused_dot_interaction` (each vector times every later one, summed
over d: one generated loop in an exported graph, slower in eager). DLRM passes
:func:`opengem.ops.kernel.inductor_kernel`: the fused form only in a program traced for AOTInductor (``bmm``
is faster eager, in the uncompiled exported program, and untested against it under ``torch.compile``'s
backward).
"""

from __future__ import annotations

import torch

from opengem.ops.fused import fused_dot_interaction
from opengem.ops.kernel import WITH_FUSED, Kernel, resolve_kernel
from opengem.ops.pytorch import pt_dot_interaction


def dot_interaction(x: torch.Tensor, *, kernel: Kernel | str = Kernel.PYTORCH) -> torch.Tensor:
    """[B, n(n-1)/2] for x [B, n, d]: the dot product of vectors i and j of each row for every i < j, in
    ``torch.triu_indices(n, n, 1)`` order (DLRM's feature interaction: each pair once)."""
    if x.dim() != 3:
        raise ValueError(f"dot_interaction: x must be [B, n, d], got {tuple(x.shape)}")
    if resolve_kernel(kernel, WITH_FUSED) is Kernel.FUSED:
        return fused_dot_interaction.dot_interaction(x)
    return pt_dot_interaction.dot_interaction(x)
