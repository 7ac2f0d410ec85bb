"""The C++ attention core (``kernel="cpp"``) against its reference, SDPA: forward and backward on random
jagged key sets (empty rows, full rows, a batch of none), strided views, every key-block count, the widths
it specialises and a generic one; its FLOP count; its refusals; and GEM's attention choosing it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from opengem.model.flops import flop_counter
from opengem.model.sequence import MultiHeadAttention, PooledAttention
from opengem.ops import attention
from opengem.ops.cpp import cpp_attention
from opengem.ops.kernel import Kernel
from twin_helpers import assert_twins_equal, rand, run_fwd_bwd

pytestmark = pytest.mark.skipif(
    not cpp_attention.available(),
    reason="the C++ attention kernel is not built here (it needs an x86 CPU with AVX2, a C++ compiler and "
           "ninja; see the warning, or OPENGEM_CPP_KERNELS)")

ATOL, RTOL = 2e-5, 1e-4


def _mask(lengths: list[int], L: int) -> torch.Tensor:
    n = torch.tensor(lengths, dtype=torch.long)
    return (torch.arange(L)[None, :] < n[:, None]).reshape(len(lengths), L)


def _jagged_lengths(B: int, L: int, seed: int) -> list[int]:
    """Random key counts 0..L with an empty row and a full row whenever there are two rows or more."""
    n = torch.randint(0, L + 1, (B,), generator=torch.Generator().manual_seed(seed)).tolist()
    if B >= 2:
        n[0], n[1] = 0, L
    return n


def _token_major(B: int, L: int, H: int, D: int, seed: int) -> torch.Tensor:
    """[B, H, L, D] as the model has it: a head-major view of a token-major [B, L, H, D] projection."""
    return rand(B, L, H, D, seed=seed).transpose(1, 2)


def _both(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> tuple:
    ref = run_fwd_bwd(lambda a, b, c: attention.masked_attention(a, b, c, mask), [q, k, v])
    got = run_fwd_bwd(lambda a, b, c: attention.masked_attention(a, b, c, mask, kernel="cpp"), [q, k, v])
    return ref, got


# (B, H, Lq, Lk, D): GEM-small's six shapes, then every key-block count (1-8 blocks of 8), one key, the
# generic width path (6, 24) and a width past one vector block (16 = two blocks, 40 = five)
SHAPES = [(16, 2, 8, 64, 8), (24, 2, 16, 16, 8), (16, 2, 2, 24, 8), (16, 1, 16, 12, 16), (16, 2, 24, 24, 8),
          (9, 3, 5, 7, 6), (7, 2, 3, 1, 8), (7, 2, 4, 9, 8), (7, 2, 4, 33, 8), (7, 2, 4, 41, 8),
          (7, 2, 4, 57, 8), (5, 1, 3, 20, 24), (5, 2, 3, 20, 40)]


@pytest.mark.parametrize("B,H,Lq,Lk,D", SHAPES)
def test_forward_and_backward_equal_the_reference_on_jagged_keys(B, H, Lq, Lk, D):
    q, k, v = (_token_major(B, L, H, D, seed) for L, seed in ((Lq, 0), (Lk, 1), (Lk, 2)))
    mask = _mask(_jagged_lengths(B, Lk, seed=B + Lk), Lk)
    ref, got = _both(q, k, v, mask)
    assert_twins_equal(ref, got, atol=ATOL, rtol=RTOL)
    # padded keys get no gradient, except slot 0 of an empty row (the one it attends to)
    dk = got[1][1]
    for b in range(B):
        n = int(mask[b].sum())
        assert dk[b, :, max(n, 1):].abs().sum() == 0


@pytest.mark.parametrize("B", [0, 1, 5])
def test_no_mask_contiguous_inputs_and_a_batch_of_none(B):
    q, k, v = rand(B, 2, 3, 8, seed=0), rand(B, 2, 10, 8, seed=1), rand(B, 2, 10, 8, seed=2)
    ref, got = _both(q, k, v, None)
    assert_twins_equal(ref, got, atol=ATOL, rtol=RTOL)


def test_output_is_a_head_major_view_of_token_major_memory():
    q, k, v = (_token_major(4, L, 2, 8, s) for L, s in ((5, 0), (7, 1), (7, 2)))
    o = attention.masked_attention(q, k, v, None, kernel="cpp")
    assert o.shape == (4, 2, 5, 8) and o.transpose(1, 2).is_contiguous()


def test_a_non_contiguous_mask_and_expanded_upstream_gradient():
    B, L = 6, 12
    q, k, v = (_token_major(B, n, 2, 8, s) for n, s in ((4, 0), (L, 1), (L, 2)))
    mask = _mask(_jagged_lengths(B, 2 * L, seed=3), 2 * L)[:, ::2]  # strided
    assert not mask.is_contiguous()
    grads = {}
    for kernel in ("pytorch", "cpp"):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        # sum(): the upstream gradient is a 0-stride expand of one scalar
        attention.masked_attention(*leaves, mask, kernel=kernel).sum().backward()
        grads[kernel] = [t.grad for t in leaves]
    for a, b in zip(grads["cpp"], grads["pytorch"]):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)


def test_bf16_runs_in_fp32_and_returns_bf16():
    q, k, v = (_token_major(4, L, 2, 8, s).to(torch.bfloat16) for L, s in ((3, 0), (9, 1), (9, 2)))
    mask = _mask([0, 9, 4, 1], 9)
    got = attention.masked_attention(q, k, v, mask, kernel="cpp")
    ref = attention.masked_attention(q, k, v, mask)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref.float(), atol=1e-2, rtol=1e-2)


def test_pooled_attention_with_the_cpp_core():
    B, M, L = 5, 3, 20
    q, k, v = _token_major(B, M, 2, 8, 0), _token_major(B, L, 2, 8, 1), _token_major(B, L, 2, 8, 2)
    mask = _mask([0, 20, 7, 1, 13], L)
    ref = run_fwd_bwd(lambda a, b, c: attention.pooled_attention(a, b, c, mask)[0], [q, k, v])
    got = run_fwd_bwd(lambda a, b, c: attention.pooled_attention(a, b, c, mask, kernel="cpp")[0], [q, k, v])
    assert_twins_equal(ref, got, atol=ATOL, rtol=RTOL)
    assert attention.pooled_attention(q, k, v, mask, kernel="cpp")[1].tolist() == \
        attention.pooled_attention(q, k, v, mask)[1].tolist()


def test_flops_count_the_same_work_as_sdpa():
    q, k, v = (_token_major(4, L, 2, 8, s).requires_grad_() for L, s in ((5, 0), (9, 1), (9, 2)))
    counts = []
    for kernel in ("pytorch", "cpp"):
        with flop_counter() as fc:
            attention.masked_attention(q, k, v, _mask([1, 9, 0, 4], 9), kernel=kernel).sum().backward()
        counts.append(fc.get_total_flops())
    assert counts[0] > 0 and counts[0] == counts[1]


def test_refuses_more_keys_than_it_holds_and_other_kernels():
    q, k = rand(2, 1, 3, 8, seed=0), rand(2, 1, 65, 8, seed=1)
    assert not cpp_attention.supports(q, k)
    with pytest.raises(ValueError, match="1 to 64 keys"):
        attention.masked_attention(q, k, k, None, kernel="cpp")
    with pytest.raises(ValueError, match="not one of: pytorch, cpp"):
        attention.masked_attention(q, k, k, None, kernel="fused")
    assert not cpp_attention.supports(q, k[:, :, :0])  # no keys: the reference's business


def test_fake_tensors_have_the_real_shapes_and_strides():
    q, k, v = (_token_major(3, L, 2, 8, s) for L, s in ((4, 0), (6, 1), (6, 2)))
    real_o, real_lse = torch.ops.opengem.attention_forward(q, k, v, None)
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        fo, flse = torch.ops.opengem.attention_forward(fq, fk, fv, None)
    assert (fo.shape, fo.stride(), flse.shape) == (real_o.shape, real_o.stride(), real_lse.shape)


@pytest.mark.parametrize("cls", [MultiHeadAttention, PooledAttention])
def test_gem_attention_runs_the_cpp_core_on_its_fused_path_with_the_reference_numbers(cls, monkeypatch):
    torch.manual_seed(0)
    mod = cls(16, num_heads=2)
    x, keys = torch.randn(6, 4, 16), torch.randn(6, 10, 16)
    mask = _mask([0, 10, 3, 1, 7, 10], 10)
    cores: list[Kernel] = []
    real = attention.masked_attention if cls is MultiHeadAttention else attention.pooled_attention

    def spy(*a, kernel=Kernel.PYTORCH, **kw):
        cores.append(Kernel(kernel))
        return real(*a, kernel=kernel, **kw)

    import opengem.model.sequence as seq

    monkeypatch.setattr(seq, real.__name__, spy)

    def run(kernel: Kernel):
        mod.kernel = kernel
        out = mod(x, keys, mask)
        return run_fwd_bwd(lambda a, b: (mod(a, b, mask)[0] if cls is PooledAttention else mod(a, b, mask)),
                           [x, keys]), out

    (ref, _), (got, _) = run(Kernel.PYTORCH), run(Kernel.FUSED)
    assert cores == [Kernel.PYTORCH, Kernel.PYTORCH, Kernel.CPP, Kernel.CPP]
    assert_twins_equal(ref, got, atol=ATOL, rtol=RTOL)


def test_opengem_cpp_kernels_0_never_builds_and_models_use_sdpa():
    code = ("import torch; from opengem.ops.cpp import cpp_attention as c; "
            "q = torch.randn(2, 1, 3, 8); print(c.available(), c.supports(q, q))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "OPENGEM_CPP_KERNELS": "0"})
    assert out.stdout.split() == ["False", "False"]
    assert "could not be built" not in out.stderr


def test_a_built_kernel_is_loaded_from_the_cache_without_building():
    """Every opengem process that runs GEM loads the kernel: from the cache it must not go through
    torch.utils.cpp_extension (its import and ninja's up-to-date check took ~5 s a process)."""
    code = ("import sys; from opengem.ops.cpp import cpp_attention as c; "
            "print(c.available(), 'torch.utils.cpp_extension' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False"]
