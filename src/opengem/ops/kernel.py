"""Which implementation an op runs: the ``kernel`` argument every public op in ``opengem.ops`` takes.

Each ``ops/<op>.py`` validates ``kernel`` here and dispatches to ``ops/pytorch/pt_<op>.py`` (the reference,
plain PyTorch plus FBGEMM's jagged ops) or to a faster twin (``ops/fused/fused_<op>.py``: hand-fused PyTorch
with fewer, contiguous ops; ``ops/triton/triton_<op>.py``: GPU kernels, checked on CPU in Triton's
interpreter; or ``ops/onednn/onednn_<op>.py``: oneDNN's CPU matrix products). An op lists the kernels it
really has (``supported``); naming any other is an error rather than a silent fallback to the reference, so
a benchmark never measures the wrong kernel.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from enum import StrEnum

import torch


class Kernel(StrEnum):
    """Implementations an op may run. ``Kernel.PYTORCH == "pytorch"``: plain strings work too."""

    PYTORCH = "pytorch"  # the reference
    FUSED = "fused"  # hand-fused PyTorch: contiguous layouts, no cat/fill_ churn, jagged where it pays
    TRITON = "triton"  # Triton kernels: CUDA tensors, or CPU tensors under TRITON_INTERPRET=1 (tests)
    ONEDNN = "onednn"  # oneDNN's fp32 CPU matrix products instead of the BLAS PyTorch links (ops/onednn/)


_BY_NAME: dict[str, Kernel] = {k.value: k for k in Kernel}
REFERENCE_ONLY: tuple[Kernel, ...] = (Kernel.PYTORCH,)
WITH_FUSED: tuple[Kernel, ...] = (Kernel.PYTORCH, Kernel.FUSED)
WITH_TRITON: tuple[Kernel, ...] = (Kernel.PYTORCH, Kernel.TRITON)
WITH_FUSED_AND_TRITON: tuple[Kernel, ...] = (Kernel.PYTORCH, Kernel.FUSED, Kernel.TRITON)


def resolve_kernel(kernel: Kernel | str, supported: tuple[Kernel, ...] = REFERENCE_ONLY) -> Kernel:
    """The :class:`Kernel` named by ``kernel`` if the op has it (``supported``), else a ValueError naming
    the choices.

    A dict lookup (not ``Kernel(kernel)``) so that torch.compile and FX tracing see a constant.
    """
    found = _BY_NAME.get(kernel) if isinstance(kernel, str) else None
    if found is None or found not in supported:
        raise ValueError(f"kernel {kernel!r} is not one of: {', '.join(k.value for k in supported)}")
    return found


_FOR_INDUCTOR: contextvars.ContextVar[bool] = contextvars.ContextVar("opengem_export_for_inductor",
                                                                     default=False)


@contextlib.contextmanager
def export_for_inductor() -> Iterator[None]:
    """Within: a ``torch.export`` traces a graph that Inductor will compile (an AOTInductor package), so
    an op whose fused form only pays once compiled may choose it (:func:`exporting_for_inductor`). A
    program saved to run as it is (the ``export`` backend) is traced outside, with the eager forms."""
    token = _FOR_INDUCTOR.set(True)
    try:
        yield
    finally:
        _FOR_INDUCTOR.reset(token)


def exporting_for_inductor() -> bool:
    """True while ``torch.export`` traces inside :func:`export_for_inductor`."""
    return _FOR_INDUCTOR.get() and torch.compiler.is_exporting()
