"""Attention ops: RoPE, key-padding masks, padded / jagged / pooled multi-head attention.

The math every GEM block shares (the long-sequence encoder, InterFormer's Sequence Arch and PMA, Wukong's
cross-layer attention), without parameters: projections stay in the model's modules. Shapes follow SDPA:
q [B, H, Lq, dh], k and v [B, H, Lk, dh], key masks [B, Lk] bool (True = real key). Every op takes
``kernel`` (see :mod:`opengem.ops.kernel`): ``"pytorch"`` runs :mod:`opengem.ops.pytorch.pt_attention` (the
reference, SDPA); the RoPE ops also have ``"fused"`` (:mod:`opengem.ops.fused.fused_attention`),
:func:`jagged_attention` has ``"triton"`` (a GPU flash kernel over packed rows), and the padded attention
cores have ``"cpp"`` (:mod:`opengem.ops.cpp.cpp_attention`: a C++ CPU kernel for GEM's many short key sets,
1.5-3.8x SDPA's CPU flash kernel there; eager only, up to 64 keys). Written-out PyTorch forms of the core
were measured slower than SDPA in GEM's step in five sessions, so it has no fused twin.

FLOPs: :func:`flop_formulas` returns the FlopCounterMode formulas for kernels torch does not count;
``opengem.model.flops.flop_counter`` passes them as ``custom_mapping``. Nothing here touches torch's global
FLOP registry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from opengem.ops.cpp import cpp_attention
from opengem.ops.fused import fused_attention
from opengem.ops.kernel import WITH_CPP, WITH_FUSED, WITH_TRITON, Kernel, resolve_kernel
from opengem.ops.pytorch import pt_attention, pt_jagged
from opengem.ops.triton import kernels as triton_kernels


def safe_key_mask(mask: torch.Tensor, *, kernel: Kernel | str = Kernel.PYTORCH) -> torch.Tensor:
    """Key mask where an empty row may attend to its first (zeroed) slot instead of producing NaN."""
    resolve_kernel(kernel)
    return pt_attention.safe_key_mask(mask)


def rope(
    x: torch.Tensor, pos: torch.Tensor, base: float = 10000.0, *, kernel: Kernel | str = Kernel.PYTORCH
) -> torch.Tensor:
    """Rotary position embedding on the last dim (half-split form): <rope(q,m), rope(k,n)> depends on m-n.

    ``pos`` broadcasts against x[..., 0] (e.g. [L] for x [B, H, L, dh]); an odd last dim passes through.
    """
    if resolve_kernel(kernel, WITH_FUSED) is Kernel.FUSED:
        return fused_attention.rope(x, pos, base)
    return pt_attention.rope(x, pos, base)


def rope_tables(length: int, dh: int, base: float = 10000.0, dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu", *, kernel: Kernel | str = Kernel.PYTORCH
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-width (cos, signed sin) [length, dh] of positions 0..length-1 for :func:`rotate` (even dh):
    made once (e.g. as a module's buffers) instead of in every forward."""
    resolve_kernel(kernel)
    if dh % 2:
        raise ValueError(f"rope_tables: the full-width tables need an even width, got {dh}")
    return pt_attention.rope_tables(torch.arange(length, device=device), dh, base, dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, kernel: Kernel | str = Kernel.PYTORCH
           ) -> torch.Tensor:
    """:func:`rope` of rows [..., L, dh] at positions 0..L-1 given :func:`rope_tables` (L, dh): the same
    values as ``rope(x, torch.arange(L))``. ``fused`` swaps the halves with ``roll`` instead of ``cat``."""
    if resolve_kernel(kernel, WITH_FUSED) is Kernel.FUSED:
        return fused_attention.rotate(x, cos, sin)
    return pt_attention.rotate(x, cos, sin)


def rope_positions(x: torch.Tensor, base: float = 10000.0, *, kernel: Kernel | str = Kernel.PYTORCH
                   ) -> torch.Tensor:
    """:func:`rope` of token-major rows [..., L, H, dh] at positions 0..L-1 (right-padded: slot = position).

    The fused kernel caches the cos/sin tables per shape and rotates in one autograd Function.
    """
    if resolve_kernel(kernel, WITH_FUSED) is Kernel.FUSED:
        return fused_attention.rope_positions(x, base)
    return pt_attention.rope_positions(x, base)


def masked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    *,
    kernel: Kernel | str = Kernel.PYTORCH,
) -> torch.Tensor:
    """softmax(q kᵀ / √dh) v per head over right-padded keys; masked keys get no weight. -> [B, H, Lq, dh].

    A row whose keys are all masked attends to its first slot only (see :func:`safe_key_mask`): callers
    zero padded slots, so such a row's output is a constant, never NaN. ``"cpp"`` takes what
    :func:`cpp_attention_supports` accepts and returns a head-major view of token-major memory.
    """
    if resolve_kernel(kernel, WITH_CPP) is Kernel.CPP:
        return cpp_attention.masked_attention(q, k, v, key_mask)
    return pt_attention.masked_attention(q, k, v, key_mask)


def cpp_attention_supports(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether the ``"cpp"`` attention core runs these q, k here (CPU, fp32/bf16, 1-64 keys, eager, built):
    for a model that picks its core per call."""
    return cpp_attention.supports(q, k)


def jagged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
    max_len: int,
    *,
    offsets: torch.Tensor | None = None,
    kernel: Kernel | str = Kernel.PYTORCH,
) -> torch.Tensor:
    """Self-attention within each jagged row: q, k, v [N, H, dh] (rows ``lengths``) -> [N, H, dh].

    Each event attends to every event of its own row (no causal mask). ``max_len`` must be >= the longest
    row. The reference pads to [B, H, max_len, dh] and runs :func:`masked_attention`; ``"triton"``
    (:mod:`opengem.ops.triton.triton_attention`) streams each row's own keys and never pads.
    """
    which = resolve_kernel(kernel, WITH_TRITON)
    if offsets is None:
        offsets = pt_jagged.lengths_to_offsets(lengths)
    if which is Kernel.TRITON:
        return triton_kernels("triton_attention", q, k, v).jagged_attention(q, k, v, offsets, max_len)
    return pt_attention.jagged_attention(q, k, v, offsets, lengths, max_len)


def pooled_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    *,
    kernel: Kernel | str = Kernel.PYTORCH,
) -> tuple[torch.Tensor, torch.Tensor]:
    """M per-row queries (target-keyed or learned seeds) pool N keys: O(M·N) -> ([B, H, M, dh], valid [B, M]).

    ``valid[b]`` is True where row b has at least one real key: a pooled token of an empty history is a
    constant and is masked out downstream. ``kernel`` picks the attention core, as :func:`masked_attention`.
    """
    which = resolve_kernel(kernel, WITH_CPP)
    core = cpp_attention.masked_attention if which is Kernel.CPP else pt_attention.masked_attention
    return pt_attention.pooled_attention(q, k, v, key_mask, core)


def flop_formulas() -> dict[Any, Callable[..., int]]:
    """Custom FlopCounterMode formulas (op -> formula) for the kernels these ops reach; a fresh dict."""
    return {**pt_attention.flop_formulas(), **cpp_attention.flop_formulas()}
