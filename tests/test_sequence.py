"""Long-sequence encoder and attention primitives: equations, masks, jagged invariance, FLOPs."""

from __future__ import annotations

import pytest
import torch

from opengem.model.flops import flop_counter
from opengem.model.sequence import MultiHeadAttention, SequenceEncoder, SequenceEncoderConfig
from opengem.ops.attention import rope
from opengem.ops.jagged import compact, gather_last

D = 16


def _jagged(lengths: list[int], L: int, garbage: float | None = None, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths_t = torch.tensor(lengths)
    mask = torch.arange(L)[None, :] < lengths_t[:, None]
    x = torch.randn(len(lengths), L, D, generator=g)
    fill = torch.zeros_like(x) if garbage is None else torch.full_like(x, garbage)
    return torch.where(mask[..., None], x, fill), mask


def test_rope_relative_position_property():
    torch.manual_seed(0)
    q, k = torch.randn(8), torch.randn(8)

    def dot(m, n):
        return (rope(q[None], torch.tensor([m]))[0] * rope(k[None], torch.tensor([n]))[0]).sum()

    assert torch.allclose(dot(3, 1), dot(10, 8), atol=1e-5)
    assert not torch.allclose(dot(3, 1), dot(3, 2), atol=1e-3)
    # a rotation keeps the norm, and position 0 is the identity
    assert torch.allclose(rope(q[None], torch.tensor([7])).norm(), q.norm(), atol=1e-5)
    assert torch.allclose(rope(q[None], torch.tensor([0]))[0], q)


def test_rope_hand_computed_2d():
    # dh = 2, one frequency (base**0 = 1): a plain 2-D rotation by the position in radians
    x = torch.tensor([[1.0, 0.0]])
    out = rope(x, torch.tensor([torch.pi / 2]))
    assert torch.allclose(out, torch.tensor([[0.0, 1.0]]), atol=1e-6)


def test_gather_last_on_jagged_rows():
    x = torch.arange(1, 13, dtype=torch.float32).view(3, 4, 1)  # rows [1..4], [5..8], [9..12]
    lengths = torch.tensor([4, 1, 0])
    out, mask = gather_last(x, lengths, 2)
    assert out[..., 0].tolist() == [[3.0, 4.0], [5.0, 0.0], [0.0, 0.0]]
    assert mask.tolist() == [[True, True], [True, False], [False, False]]


def test_compact_keeps_order_and_moves_real_tokens_first():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]]).view(1, 4, 1)
    mask = torch.tensor([[False, True, False, True]])
    out, m = compact(x, mask)
    assert out[0, :, 0].tolist() == [2.0, 4.0, 0.0, 0.0]
    assert m.tolist() == [[True, True, False, False]]


def test_attention_ignores_padding_and_survives_empty_rows():
    torch.manual_seed(0)
    attn = MultiHeadAttention(D, 2, use_rope=True)
    q = torch.randn(3, 2, D)
    x0, mask = _jagged([5, 2, 0], 6)
    x1, _ = _jagged([5, 2, 0], 6, garbage=1e3)
    a, b = attn(q, x0, mask), attn(q, x1, mask)
    assert torch.isfinite(a).all()
    assert torch.allclose(a[:2], b[:2], atol=1e-5)


@pytest.mark.parametrize("kind", ["pyramid", "full", "none"])
def test_encoder_rows_independent_of_batch_padding(kind):
    """A row gives the same output alone (padded to its own length) or beside longer, garbage-padded rows."""
    torch.manual_seed(0)
    cfg = SequenceEncoderConfig(kind=kind, levels=2, window=4, pool_tokens=2, chunk=4, truncate=5)
    enc = SequenceEncoder(D, 40, cfg).eval()
    lengths = [37, 3, 0, 12]
    x, mask = _jagged(lengths, 40, garbage=7.0)
    target = torch.randn(4, D)
    out, out_mask = enc(x, mask, target)
    assert torch.isfinite(out).all()
    for i, n in enumerate(lengths):
        xi, mi = x[i : i + 1, : max(n, 1)], mask[i : i + 1, : max(n, 1)]
        oi, omi = enc(torch.where(mi[..., None], xi, torch.zeros_like(xi)), mi, target[i : i + 1])
        k = int(omi.sum())
        assert k == int(out_mask[i].sum())
        assert torch.allclose(oi[0, :k], out[i, :k], atol=1e-5), f"row {i} (length {n}) depends on its batch"


def test_pyramid_shrinks_and_backpropagates():
    cfg = SequenceEncoderConfig(kind="pyramid", levels=5, window=8, pool_tokens=4, chunk=8)
    enc = SequenceEncoder(D, 200, cfg)
    # W + M + ceil(N / C): 200 -> 37 -> 17 -> 15 -> 14, and a fifth level (14 -> 14) would not shrink
    assert len(enc.levels) == 4 and enc.out_len(200) == 14
    x, mask = _jagged([200, 50], 200)
    x.requires_grad_(True)
    target = torch.randn(2, D, requires_grad=True)
    out, m = enc(x, mask, target)
    assert out.shape[1] == enc.out_len(200) < 200
    out.sum().backward()
    assert x.grad is not None and target.grad is not None and x.grad.abs().sum() > 0
    assert x.grad[1, 50:].abs().sum() == 0  # padding receives no gradient


def test_pyramid_plan_levels():
    enc = SequenceEncoder(D, 12, SequenceEncoderConfig(window=32, pool_tokens=8, chunk=32))
    assert len(enc.levels) == 0  # a short sequence passes through: no level would shrink it


@pytest.mark.parametrize("kind", ["pyramid", "full"])
def test_encoder_flops_match_counter(kind):
    cfg = SequenceEncoderConfig(kind=kind, levels=2, window=8, pool_tokens=4, chunk=8)
    enc = SequenceEncoder(D, 64, cfg)
    x, mask = _jagged([64, 64], 64)
    with torch.no_grad(), flop_counter() as fc:
        enc(x, mask, torch.randn(2, D))
    measured = fc.get_total_flops() / 2
    assert measured > 0
    assert abs(enc.flops(64) - measured) / measured < 0.10


def test_bad_kind_is_a_clear_error():
    with pytest.raises(ValueError, match="sequence.kind"):
        SequenceEncoder(D, 10, SequenceEncoderConfig(kind="nope"))


class _Attend(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mha = MultiHeadAttention(16, 2, use_rope=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mha(x, x)


def test_a_program_for_inductor_reads_rope_tables_made_as_buffers_in_the_warm_up(tmp_path):
    """Traced for Inductor, RoPE's tables are buffers made by an eager forward before the trace (not
    computed in the graph, where Inductor re-evaluates cos/sin per element; not tensors made during the
    trace, which AOTAutograd refuses): the program has no cos/sin, compiles, and equals eager."""
    from torch._inductor import aoti_compile_and_package
    from torch._inductor.package import load_package

    from opengem.ops.kernel import export_for_inductor

    m, x = _Attend().eval(), torch.randn(4, 24, 16)
    batch = torch.export.Dim("batch")
    with torch.no_grad():
        plain = torch.export.export(m, (x,), dynamic_shapes=({0: batch},), strict=False)
        with export_for_inductor():
            m(x)  # the warm-up
            traced = torch.export.export(m, (x,), dynamic_shapes=({0: batch},), strict=False)
    assert {n for n, _ in m.mha.named_buffers()} == {"_rope_tables_24x8_cos", "_rope_tables_24x8_sin"}
    ops = {p: {str(node.target) for node in p.graph.nodes} for p in (plain, traced)}
    assert "aten.cos.default" in ops[plain] and "aten.cos.default" not in ops[traced]
    package = load_package(aoti_compile_and_package(traced, package_path=str(tmp_path / "m.pt2")))
    for n in (1, 4, 9):
        x = torch.randn(n, 24, 16)
        with torch.no_grad():
            assert (package(x) - m(x)).abs().max().item() <= 1e-5
            assert (traced.module()(x) - m(x)).abs().max().item() <= 1e-5
