"""Triton twins of the ops (``kernel="triton"``): GPU kernels that CI checks on CPU in Triton's interpreter.

Triton decides at ``@triton.jit`` time whether a kernel is compiled for a GPU or run by its interpreter
(``TRITON_INTERPRET=1``, numpy on the CPU), so the kernel modules here are imported only when an op is
asked for ``kernel="triton"``, after :func:`require_triton` has checked that one of the two can run. On
a CPU without the interpreter that is an error naming both ways out, never a silent fallback: a benchmark
must not measure the reference while believing it measured Triton.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

import torch


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def require_triton(*tensors: torch.Tensor) -> None:
    """Raise a RuntimeError unless Triton is installed and can run on these tensors: CUDA tensors, or CPU
    tensors under the interpreter."""
    if importlib.util.find_spec("triton") is None:
        raise RuntimeError("kernel 'triton' needs the triton package (pip install triton)")
    on_cuda = all(t.is_cuda for t in tensors)
    if not on_cuda and not interpreting():
        raise RuntimeError("kernel 'triton' runs on CUDA tensors, or on CPU tensors only in Triton's "
                           "interpreter (set TRITON_INTERPRET=1 before the first triton op; it is slow: for "
                           "tests)")
    if interpreting() and any(t.is_cuda for t in tensors):
        raise RuntimeError("TRITON_INTERPRET=1 runs Triton on CPU tensors; these are on CUDA")
    if interpreting() and not _imported_interpreted():
        raise RuntimeError("TRITON_INTERPRET=1 was set after triton was imported (importing torch imports "
                           "it), so Triton's own library is compiled-mode: set it in the environment before "
                           "Python starts")


def _imported_interpreted() -> bool:
    """Was triton imported under the interpreter? Its library functions (``tl.sum``) were wrapped then."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.sum, InterpretedFunction)


def kernels(name: str, *tensors: torch.Tensor) -> ModuleType:
    """``opengem.ops.triton.<name>`` (e.g. ``"triton_fmb"``), imported only after :func:`require_triton` has
    passed for these tensors: the import is where ``@triton.jit`` decides between GPU and interpreter."""
    require_triton(*tensors)
    return importlib.import_module(f"{__name__}.{name}")


def block(n: int, floor: int = 16) -> int:
    """The power-of-two tile that covers ``n``, at least ``floor`` (``tl.dot`` needs tiles of >= 16)."""
    return max(floor, 1 << max(0, (int(n) - 1).bit_length()))
