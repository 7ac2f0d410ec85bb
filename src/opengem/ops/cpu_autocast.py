"""Thin products stay in fp32 under CPU autocast: a decorator for the ops and modules that are made of them.

Why: on a CPU, ``train.precision = "bf16"`` pays on wide products (Wukong's MLPs, the head: K and N in the
hundreds, where AMX runs ~3x the fp32 rate) but not on thin ones. GEM's sequence side works on d-wide
tokens (32 in GEM-small): every projection there is a [B·L, d] x [d, d] product bound by memory traffic,
and the Wukong FMB's X·(XᵀY) and token mixing are batched [n, d] products that CPU bf16 runs SLOWER than
fp32 (measured, one thread: bmm [1024, 32, 16] x [1024, 16, 32] 2.3 ms in bf16 vs 1.3 ms in fp32). Under
autocast they still paid a cast of every operand to bf16 and back to fp32 for LayerNorm, softmax and the
attention core (which already runs in fp32 on CPU): 14.9 % of GEM-small's bf16 op time was ``copy_``,
12,800 casts a step. With this decorator on those blocks (in-process A/B, alternating steps, one thread):
sequence side 546 -> 518 ms a step, then the fused FMB products 510 -> 499 ms.
Only CPU autocast is read: on GPU (CUDA autocast, tensor cores) nothing changes.

That measurement was an AMX host's. On an AVX-512 host with bf16 dot products but no AMX (AMD Zen 4, session
50) the same thin products run 1.3-2.7x faster in bf16 than in fp32, cast included ([16384, 32] x [32, 32]:
0.18 vs 0.41 ms; bmm [512, 32, 32] x [512, 32, 32]: 0.24 vs 0.48 ms), and GEM-small's bf16 step with them left
to autocast took 0.895x the CPU time of the step with them kept in fp32 (in-process A/B, interleaved windows;
``opengem bench train``: 2,772 vs 2,561 examples/s, 1.08x; benchmarks/results/2026-12-07-s50/bf16_thin/).
So the choice is the host's: ``train.cpu_bf16_thin`` (``thin_products``) says which, "fp32" by default.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])

THIN_CHOICES = ("fp32", "bf16")
# the choice thin_products set: a plain global rather than a ContextVar, so that torch.compile guards on it
_thin = "fp32"


@contextlib.contextmanager
def thin_products(choice: str) -> Iterator[None]:
    """Within: the blocks decorated with :func:`fp32_under_cpu_autocast` run in fp32 ("fp32", the default
    outside too) or under autocast like the rest of the model ("bf16"). For one training thread: the step
    enters it with autocast; activation checkpointing re-enters it for the recompute (``current_thin``)."""
    global _thin
    if choice not in THIN_CHOICES:
        raise ValueError(f"train.cpu_bf16_thin: {choice!r} is not one of {', '.join(THIN_CHOICES)}")
    before, _thin = _thin, choice
    try:
        yield
    finally:
        _thin = before


def current_thin() -> str:
    """The choice in force (for a recompute that runs outside the step's context)."""
    return _thin


def _to_fp32(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.float() if x.is_floating_point() and x.dtype != torch.float32 else x
    if isinstance(x, list | tuple):
        return type(x)(_to_fp32(t) for t in x)
    return x


def fp32_under_cpu_autocast(fn: F) -> F:
    """Decorate a function or a module's ``forward``: under CPU autocast it runs with autocast off on fp32
    inputs (floating tensors, also inside lists and tuples, are cast once at entry), so it returns fp32;
    otherwise, or within ``thin_products("bf16")``, it runs unchanged."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_autocast_enabled("cpu") or _thin == "bf16":
            return fn(*args, **kwargs)
        with torch.autocast("cpu", enabled=False):
            return fn(*_to_fp32(args), **{k: _to_fp32(v) for k, v in kwargs.items()})

    return wrapped  # type: ignore[return-value]


def to_cpu_autocast_dtype(x: torch.Tensor) -> torch.Tensor:
    """``x`` in CPU autocast's dtype when autocast is on (one cast, here), else ``x`` unchanged.

    Why: autocast casts a matmul's fp32 input to bf16 at every matmul that reads it, and an elementwise op
    or ``cat`` mixing a bf16 and an fp32 tensor promotes back to fp32. A wide activation read by several
    matmuls, or rebuilt by a residual each layer, is then cast again and again: DCNv2's cross network
    (``x0 * W x_l + x_l``, three layers) and its final ``cat`` of the cross and deep outputs cost 20 casts
    of [4096, 176] and 2 of [4096, 576] per step at the peer settings, plus a mixed-dtype ``cat``: about half
    of the bf16 step's CPU time. Cast once where the activation is made and the rest stays bf16 (the
    master weights, the loss and the optimizer stay fp32)."""
    if x.is_floating_point() and torch.is_autocast_enabled("cpu"):
        dtype = torch.get_autocast_dtype("cpu")
        return x if x.dtype == dtype else x.to(dtype)
    return x
