"""Test helpers for kernel twins (a reference op and its fused variant): seeded random tensors, and one
forward + backward under a fixed random upstream gradient."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from opengem.ops.onednn import onednn_linear

# the project's torch (the CPU wheel requirements/ installs) has oneDNN; another build may not
needs_onednn = pytest.mark.skipif(
    not onednn_linear.available(),
    reason="this torch build has no oneDNN (torch.backends.mkldnn), so kernel='onednn' cannot run here; "
           "install the torch of requirements/ to test it")


def rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def run_fwd_bwd(fn: Callable[..., torch.Tensor], inputs: list, seed: int = 7
                ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """Output and the gradient of every tensor input (None stays None) under a random upstream gradient."""
    leaves = [None if x is None else x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    (out * rand(*out.shape, seed=seed)).sum().backward()
    return out.detach(), [None if x is None else x.grad for x in leaves]


def tokens(B: int, n: int, d: int, zero_rows: tuple[int, ...] = ()) -> torch.Tensor:
    """Random token batches [B, n, d] whose examples ``zero_rows`` are all zero (LayerNorm's variance 0)."""
    x = rand(B, n, d, seed=B * 100 + n)
    for r in zero_rows:
        x[r] = 0.0
    return x


def assert_twins_equal(ref: tuple, got: tuple, atol: float, rtol: float) -> None:
    """``run_fwd_bwd`` results of a reference and its twin: same output, and the same gradient (or None)
    for every input."""
    (o_ref, g_ref), (o_got, g_got) = ref, got
    assert o_ref.shape == o_got.shape
    torch.testing.assert_close(o_got, o_ref, atol=atol, rtol=rtol)
    for a, b in zip(g_ref, g_got):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, atol=atol, rtol=rtol)


def fmb_inputs(B: int, n: int, d: int, k: int, dims: list[int], zero_rows: tuple[int, ...], per_example: bool
               ) -> tuple[list[torch.Tensor], Callable[[str], Callable[..., torch.Tensor]]]:
    """Inputs of ``opengem.ops.fmb.fmb`` (tokens with all-zero examples ``zero_rows``, a shared or per-example
    Y, the LayerNorm affine, MLP weights and biases) and, per kernel name, a function of those inputs."""
    from opengem.ops import fmb as fmb_ops

    x = tokens(B, n, d, zero_rows)
    y = rand(B, n, k, seed=3) if per_example else rand(n, k, seed=3)
    widths = [n * k, *dims]
    ws = [rand(o, i, seed=10 + j) / i**0.5 for j, (i, o) in enumerate(zip(widths[:-1], widths[1:]))]
    bs = [rand(o, seed=20 + j) for j, o in enumerate(widths[1:])]
    ln_w, ln_b = 1 + 0.1 * rand(n * k, seed=4), 0.1 * rand(n * k, seed=5)
    L = len(ws)

    def call(kernel: str) -> Callable[..., torch.Tensor]:
        return lambda x, y, lw, lb, *wb: fmb_ops.fmb(x, y, lw, lb, list(wb[:L]), list(wb[L:]), kernel=kernel)

    return [x, y, ln_w, ln_b, *ws, *bs], call
