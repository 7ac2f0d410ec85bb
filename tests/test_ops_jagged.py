"""opengem.ops.jagged against plain per-row loops: forward and backward, empty rows and batches, kernels."""

from __future__ import annotations

import inspect

import pytest
import torch

from opengem.ops import attention, jagged
from opengem.ops.kernel import Kernel, resolve_kernel
from opengem.ops.pytorch.pt_attention import rope_tables as pt_rope_tables

# (lengths, max_len): empty rows, all-padding rows, rows cut at max_len, a batch of one, a batch of none
CASES = [
    ([3, 0, 5, 1], 6),
    ([0, 0, 0], 4),
    ([7, 2, 0, 9], 5),
    ([4], 4),
    ([], 3),
]


def _values(lengths: list[int], inner: tuple[int, ...], seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    if dtype.is_floating_point:
        return torch.randn(n, *inner, generator=g).to(dtype)
    return torch.randint(0, 1000, (n, *inner), generator=g).to(dtype)


def _ref_padded(values: torch.Tensor, lengths: list[int], L: int, pad: float) -> torch.Tensor:
    """Row by row: the first min(n, L) events of each row, then ``pad``."""
    rows, start = [], 0
    for n in lengths:
        row = values[start : start + n][:L]
        fill = torch.full((L - row.shape[0], *values.shape[1:]), pad, dtype=values.dtype)
        rows.append(torch.cat([row, fill]))
        start += n
    return torch.stack(rows) if rows else torch.zeros(0, L, *values.shape[1:], dtype=values.dtype)


def _ref_mask(lengths: list[int], L: int) -> torch.Tensor:
    rows = [[j < n for j in range(L)] for n in lengths]
    return torch.tensor(rows, dtype=torch.bool).reshape(len(lengths), L)


def _padded(lengths: list[int], L: int, d: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random right-padded rows [B, L, d] with garbage (not zeros) in the padding, and their mask."""
    g = torch.Generator().manual_seed(seed)
    mask = _ref_mask([min(n, L) for n in lengths], L)
    x = torch.randn(len(lengths), L, d, generator=g)
    return torch.where(mask[..., None], x, torch.full_like(x, 9.0)), mask


def _grads(fn, *inputs: torch.Tensor, seed: int = 1) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """fn's output and the gradients of <output, random upstream> w.r.t. ``inputs``."""
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    out = out[0] if isinstance(out, tuple) else out
    up = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    if out.requires_grad:  # a reference built only from fill values has no graph: every gradient is zero
        (out * up).sum().backward()
    return out.detach(), [x.grad if x.grad is not None else torch.zeros_like(x) for x in leaves]


# --------------------------------------------------------------------------- offsets, lengths, masks


@pytest.mark.parametrize("lengths,L", CASES)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_offsets_and_lengths_round_trip(lengths, L, dtype):
    t = torch.tensor(lengths, dtype=dtype)
    offsets = jagged.lengths_to_offsets(t)
    expected = [0]
    for n in lengths:
        expected.append(expected[-1] + n)
    assert offsets.dtype == dtype and offsets.tolist() == expected
    back = jagged.offsets_to_lengths(offsets)
    assert back.dtype == dtype and back.tolist() == lengths


@pytest.mark.parametrize("lengths,L", CASES)
def test_padding_mask(lengths, L):
    assert torch.equal(jagged.padding_mask(torch.tensor(lengths, dtype=torch.long), L), _ref_mask(lengths, L))


# --------------------------------------------------------------------------- jagged <-> padded


@pytest.mark.parametrize("lengths,L", CASES)
@pytest.mark.parametrize("inner", [(), (3,), (2, 3)])
def test_jagged_to_padded_forward_and_backward(lengths, L, inner):
    values = _values(lengths, inner)
    lt = torch.tensor(lengths, dtype=torch.long)
    out, g = _grads(lambda v: jagged.jagged_to_padded(v, lt, L, -2.5), values)
    ref_out, ref_g = _grads(lambda v: _ref_padded(v, lengths, L, -2.5), values)
    assert out.shape == (len(lengths), L, *inner)
    assert torch.equal(out, ref_out)
    assert torch.equal(g[0], ref_g[0])  # events past max_len get no gradient
    _, mask = jagged.jagged_to_padded(values, lt, L)
    assert torch.equal(mask, _ref_mask(lengths, L))
    given = jagged.jagged_to_padded(values, lt, L, -2.5, offsets=jagged.lengths_to_offsets(lt))[0]
    assert torch.equal(given, ref_out)


@pytest.mark.parametrize("dtype,pad", [(torch.int64, -1), (torch.int64, 0), (torch.int32, 7)])
def test_jagged_to_padded_integer_ids(dtype, pad):
    lengths = [2, 0, 3]
    values = _values(lengths, (), dtype=dtype)
    out, _ = jagged.jagged_to_padded(values, torch.tensor(lengths), 4, pad)
    assert out.dtype == dtype and torch.equal(out, _ref_padded(values, lengths, 4, pad))


@pytest.mark.parametrize("lengths,L", [c for c in CASES if max(c[0], default=0) <= c[1]])
@pytest.mark.parametrize("inner", [(3,), (2, 3)])
def test_padded_to_jagged_forward_and_backward(lengths, L, inner):
    g = torch.Generator().manual_seed(3)
    padded = torch.randn(len(lengths), L, *inner, generator=g)
    lt = torch.tensor(lengths, dtype=torch.long)

    def ref(p: torch.Tensor) -> torch.Tensor:
        rows = [p[b, :n] for b, n in enumerate(lengths)]
        return torch.cat(rows) if rows else p.new_zeros(0, *inner)

    out, grads = _grads(lambda p: jagged.padded_to_jagged(p, lt), padded)
    ref_out, ref_grads = _grads(ref, padded)
    assert torch.equal(out, ref_out) and torch.equal(grads[0], ref_grads[0])
    total = jagged.padded_to_jagged(padded, lt, total=sum(lengths), offsets=jagged.lengths_to_offsets(lt))
    assert torch.equal(total, ref_out)
    # the two conversions are inverse on real events
    back, _ = jagged.jagged_to_padded(out, lt, L)
    assert torch.equal(back, _ref_padded(ref_out, lengths, L, 0.0))


# --------------------------------------------------------------------------- padded-row helpers


@pytest.mark.parametrize("lengths,L", CASES)
def test_zero_padding_forward_and_backward(lengths, L):
    x, mask = _padded(lengths, L)

    def ref(v: torch.Tensor) -> torch.Tensor:
        rows = [torch.stack([v[b, j] if mask[b, j] else torch.zeros_like(v[b, j]) for j in range(L)])
                for b in range(len(lengths))]
        return torch.stack(rows) if rows else v * 0

    out, g = _grads(lambda v: jagged.zero_padding(v, mask), x)
    ref_out, ref_g = _grads(ref, x)
    assert torch.equal(out, ref_out) and torch.equal(g[0], ref_g[0])


def test_ensure_nonempty_adds_one_masked_slot_only_when_length_is_zero():
    v, m = jagged.ensure_nonempty(torch.ones(3, 0, 4), torch.zeros(3, 0, dtype=torch.bool))
    assert v.shape == (3, 1, 4) and not v.any() and m.shape == (3, 1) and not m.any()
    x, mask = _padded([2, 0], 3)
    same = jagged.ensure_nonempty(x, mask)
    assert same[0] is x and same[1] is mask
    v0, m0 = jagged.ensure_nonempty(torch.ones(0, 0, 4), torch.zeros(0, 0, dtype=torch.bool))
    assert v0.shape == (0, 1, 4) and m0.shape == (0, 1)


def _ref_gather_last(x: torch.Tensor, lengths: list[int], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row by row: the row's last min(n, k) real events, oldest first, then zero slots up to k."""
    rows, masks = [], []
    for b, n in enumerate(lengths):
        last = x[b, max(n - k, 0) : n]
        rows.append(torch.cat([last, x.new_zeros(k - last.shape[0], x.shape[2])]))
        masks.append([j < last.shape[0] for j in range(k)])
    if not rows:
        return x.new_zeros(0, k, x.shape[2]), torch.zeros(0, k, dtype=torch.bool)
    return torch.stack(rows), torch.tensor(masks, dtype=torch.bool)


@pytest.mark.parametrize("lengths,L", [c for c in CASES if max(c[0], default=0) <= c[1]])
@pytest.mark.parametrize("k", [1, 2, 5, 8])
def test_gather_last_forward_and_backward(lengths, L, k):
    x, _ = _padded(lengths, L)
    lt = torch.tensor(lengths, dtype=torch.long)
    out, g = _grads(lambda v: jagged.gather_last(v, lt, k), x)
    ref_out, ref_g = _grads(lambda v: _ref_gather_last(v, lengths, k), x)
    assert torch.equal(out, ref_out) and torch.equal(g[0], ref_g[0])
    assert torch.equal(jagged.gather_last(x, lt, k)[1], _ref_gather_last(x, lengths, k)[1])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("B", [0, 1, 4])
def test_compact_forward_and_backward(seed, B):
    g = torch.Generator().manual_seed(seed)
    L, d = 7, 3
    mask = torch.rand(B, L, generator=g) < 0.5
    if B:
        mask[0] = False  # an all-padding row
    x = torch.randn(B, L, d, generator=g)

    def ref(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows, masks = [], []
        for b in range(B):
            real = [v[b, j] for j in range(L) if mask[b, j]]
            rows.append(torch.stack(real + [v.new_zeros(d)] * (L - len(real))))
            masks.append([j < len(real) for j in range(L)])
        if not rows:
            return v * 0, torch.zeros(0, L, dtype=torch.bool)
        return torch.stack(rows), torch.tensor(masks, dtype=torch.bool)

    out, grads = _grads(lambda v: jagged.compact(v, mask), x)
    ref_out, ref_grads = _grads(ref, x)
    assert torch.equal(out, ref_out) and torch.equal(grads[0], ref_grads[0])
    assert torch.equal(jagged.compact(x, mask)[1], ref(x)[1])


# --------------------------------------------------------------------------- kernels


def _sample_args() -> dict[str, tuple]:
    """One valid call per public op of ops.jagged and ops.attention (kernel added by the test)."""
    lengths = torch.tensor([2, 0, 3])
    x, mask = _padded([2, 0, 3], 4)
    q = torch.randn(3, 2, 4, 5)
    jq = torch.randn(5, 2, 3)
    return {
        "jagged.lengths_to_offsets": (lengths,),
        "jagged.offsets_to_lengths": (torch.tensor([0, 2, 2, 5]),),
        "jagged.padding_mask": (lengths, 4),
        "jagged.jagged_to_padded": (torch.randn(5, 3), lengths, 4),
        "jagged.padded_to_jagged": (x, lengths),
        "jagged.zero_padding": (x, mask),
        "jagged.ensure_nonempty": (x, mask),
        "jagged.gather_last": (x, lengths, 2),
        "jagged.keep_last_index": (lengths, 2),
        "jagged.compact": (x, mask),
        "attention.safe_key_mask": (mask,),
        "attention.rope": (q, torch.arange(4)),
        "attention.rope_positions": (q,),
        "attention.rope_tables": (4, 6),
        "attention.rotate": (torch.randn(3, 2, 4, 6), *pt_rope_tables(torch.arange(4), 6, 1e4,
                                                                      torch.float32)),
        "attention.masked_attention": (q, q, q, mask),
        "attention.jagged_attention": (jq, jq, jq, lengths, 3),
        "attention.pooled_attention": (q[:, :, :2], q, q, mask),
    }


def _public_ops() -> dict[str, object]:
    ops = {}
    for mod in (jagged, attention):
        for name, fn in vars(mod).items():
            if inspect.isfunction(fn) and fn.__module__ == mod.__name__ and not name.startswith("_"):
                ops[f"{mod.__name__.rsplit('.', 1)[1]}.{name}"] = fn
    return ops


def test_every_public_op_takes_kernel_and_dispatches_or_raises():
    # not ops: the FLOP formulas, and whether the C++ core takes a call (tests/test_ops_cpp_attention.py)
    ops = {k: v for k, v in _public_ops().items()
           if k not in ("attention.flop_formulas", "attention.cpp_attention_supports")}
    args = _sample_args()
    assert set(ops) == set(args), "every public op needs a sample call here"
    for name, fn in ops.items():
        param = inspect.signature(fn).parameters.get("kernel")
        assert param is not None and param.kind is inspect.Parameter.KEYWORD_ONLY, name
        assert param.default == "pytorch", name
        a = fn(*args[name], kernel="pytorch")
        b = fn(*args[name], kernel=Kernel.PYTORCH)
        for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
            assert torch.equal(x, y), name
        for bad in ("compiled", "PyTorch", "", *(() if name in TRITON_TWINS else ("triton",)),
                    *(() if name in CPP_TWINS else ("cpp",))):
            with pytest.raises(ValueError, match=r"kernel .* is not one of: pytorch"):
                fn(*args[name], kernel=bad)
        if name in TRITON_TWINS:  # runs in Triton's interpreter here (tests/test_ops_triton.py checks it)
            c = fn(*args[name], kernel="triton")
            torch.testing.assert_close(c, a, atol=1e-5, rtol=1e-4)
        if name in FUSED_TWINS:  # the twin runs and agrees (tests/test_ops_fused.py checks it thoroughly)
            c = fn(*args[name], kernel="fused")
            for x, y in zip(a if isinstance(a, tuple) else (a,), c if isinstance(c, tuple) else (c,)):
                torch.testing.assert_close(y, x, atol=1e-5, rtol=1e-4)
        else:  # no silent fallback to the reference
            with pytest.raises(ValueError, match=r"kernel 'fused' is not one of: pytorch(, triton|, cpp)?$"):
                fn(*args[name], kernel="fused")


FUSED_TWINS = {"attention.rope", "attention.rope_positions", "attention.rotate"}
TRITON_TWINS = {"attention.jagged_attention"}
CPP_TWINS = {"attention.masked_attention", "attention.pooled_attention"}


def test_resolve_kernel():
    assert resolve_kernel("pytorch") is Kernel.PYTORCH and resolve_kernel(Kernel.PYTORCH) is Kernel.PYTORCH
    for bad in (None, 0, "torch"):
        with pytest.raises(ValueError, match="pytorch"):
            resolve_kernel(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("lengths,L", CASES)
@pytest.mark.parametrize("k", [1, 2, 5, 8])
def test_keep_last_index_keeps_each_rows_most_recent_events(lengths, L, k):
    values = _values(lengths, (3,), seed=k)
    index, kept = jagged.keep_last_index(torch.tensor(lengths, dtype=torch.long), k)
    ref, start = [], 0
    for n in lengths:  # row by row: the last min(n, k) values, in order
        ref.append(values[start + max(n - k, 0) : start + n])
        start += n
    assert kept.tolist() == [min(n, k) for n in lengths]
    assert torch.equal(values.index_select(0, index), torch.cat(ref) if ref else values[:0])


def test_keep_last_index_refuses_k_below_one():
    with pytest.raises(ValueError, match="k must be >= 1"):
        jagged.keep_last_index(torch.tensor([2, 3]), 0)
