"""Which implementation an op runs: the ``kernel`` argument every public op in ``opengem.ops`` takes.

Each ``ops/<op>.py`` validates ``kernel`` here and dispatches to ``ops/pytorch/pt_<op>.py`` (the reference,
plain PyTorch plus FBGEMM's jagged ops) or to a faster twin (``ops/fused/fused_<op>.py``: hand-fused PyTorch
with fewer, contiguous ops; ``ops/triton/triton_<op>.py``: GPU kernels, checked on CPU in Triton's
interpreter; ``ops/onednn/onednn_<op>.py``: oneDNN's CPU matrix products; or ``ops/cpp/cpp_<op>.py``: C++
CPU kernels compiled on first use). An op lists the kernels it
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
    CPP = "cpp"  # C++ CPU kernels built on first use with torch.utils.cpp_extension (ops/cpp/)


_BY_NAME: dict[str, Kernel] = {k.value: k for k in Kernel}
REFERENCE_ONLY: tuple[Kernel, ...] = (Kernel.PYTORCH,)
WITH_FUSED: tuple[Kernel, ...] = (Kernel.PYTORCH, Kernel.FUSED)
WITH_TRITON: tuple[Kernel, ...] = (Kernel.PYTORCH, Kernel.TRITON)
WITH_FUSED_AND_TRITON: tuple[Kernel, ...] = (Kernel.PYTORCH, Kernel.FUSED, Kernel.TRITON)
WITH_CPP: tuple[Kernel, ...] = (Kernel.PYTORCH, Kernel.CPP)


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
    an op whose fused form only pays once compiled may choose it (:func:`exporting_for_inductor`), after
    an eager forward in which modules may make their constants (:func:`preparing_for_inductor`). A
    program saved to run as it is (the ``export`` backend) is traced outside, with the eager forms."""
    token = _FOR_INDUCTOR.set(True)
    try:
        yield
    finally:
        _FOR_INDUCTOR.reset(token)


def exporting_for_inductor() -> bool:
    """True while ``torch.export`` traces inside :func:`export_for_inductor`."""
    return torch.compiler.is_exporting() and _FOR_INDUCTOR.get()  # (torch.compile: False before the get)


def preparing_for_inductor() -> bool:
    """True in an eager forward inside :func:`export_for_inductor` (the warm-up before the trace): a
    module makes here, as buffers, the constants its traced form will read (a buffer is a constant of the
    compiled program; a tensor made during the trace is not, or trips AOTAutograd)."""
    return not torch.compiler.is_compiling() and _FOR_INDUCTOR.get() and not torch.compiler.is_exporting()


def inductor_kernel() -> Kernel:
    """``fused`` while ``torch.export`` traces for Inductor (:func:`export_for_inductor`), else the
    reference: for the ops whose fused form pays only in a compiled graph (they say so)."""
    return Kernel.FUSED if exporting_for_inductor() else Kernel.PYTORCH
