"""InterFormer blocks: PFFN, Cross Arch summaries, masks, flags, gradients, FLOPs."""

from __future__ import annotations

import pytest
import torch

from opengem.model.flops import flop_counter
from opengem.model.interformer import CrossArch, InterFormer, InterFormerConfig, SequenceArch
from opengem.model.wukong import WukongConfig

D = 8


def _seq(lengths: list[int], L: int, garbage: float = 0.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]
    x = torch.randn(len(lengths), L, D, generator=g)
    return torch.where(mask[..., None], x, torch.full_like(x, garbage)), mask


def test_pffn_applies_each_examples_own_weight():
    cfg = InterFormerConfig(n_cls=1)
    arch = SequenceArch(2, cfg)
    with torch.no_grad():  # W_b = reshape(x_sum) exactly: weight = identity, no bias
        arch.pffn_gen.weight.zero_()
        arch.pffn_gen.bias.zero_()
        arch.pffn_gen.weight[:2, :2] = torch.eye(2)
    x_sum = torch.tensor([[[1.0, 2.0]], [[0.0, -1.0]]])  # W_0 = [[1, 2], [0, 0]], W_1 = [[0, -1], [0, 0]]
    s = torch.tensor([[[1.0, 1.0], [3.0, 0.0]], [[2.0, 5.0], [1.0, 1.0]]])
    out = arch.pffn(x_sum, s)
    # s @ W_b: row 0: [1,1]@W_0 = [1, 2], [3,0]@W_0 = [3, 6]; row 1: [2,5]@W_1 = [0, -2], [1,1]@W_1 = [0, -1]
    assert out.tolist() == [[[1.0, 2.0], [3.0, 6.0]], [[0.0, -2.0], [0.0, -1.0]]]


def test_cross_arch_summaries_cls_and_recent_k():
    cfg = InterFormerConfig(n_cls=2, n_pma=1, n_recent=2, gate="none")
    arch = CrossArch(3, D, cfg)
    x = torch.randn(2, 3, D)
    s, mask = _seq([6, 3], 7, garbage=99.0)
    x_sum, s_sum = arch(x, s, mask)
    assert x_sum.shape == (2, 2, D) and s_sum.shape == (2, 5, D)
    assert torch.allclose(x_sum, torch.einsum("mn,bnd->bmd", arch.compress.W, x))
    assert torch.equal(s_sum[:, :2], s[:, :2])  # CLS = first n_cls positions
    assert torch.equal(s_sum[0, 3:], s[0, 4:6]) and torch.equal(s_sum[1, 3:], s[1, 1:3])  # last 2 real events


@pytest.mark.parametrize(
    "over",
    [{}, {"seq_norm": "post"}, {"seq_norm": "none", "seq_residual": False},
     {"gate": "none", "use_pffn": False}, {"use_rope": False, "n_pma": 0, "n_recent": 0}],
)
def test_interformer_shapes_gradients_and_padding_invariance(over):
    torch.manual_seed(0)
    cfg = InterFormerConfig(num_layers=2, num_heads=2, **over)
    wcfg = WukongConfig(n_fm=3, n_lin=2, k=2, mlp_dims=[16], cross_layer_attention=True)
    model = InterFormer(5, D, wcfg, cfg)
    x = torch.randn(3, 5, D, requires_grad=True)
    s0, mask = _seq([9, 2, 0], 9)
    s1, _ = _seq([9, 2, 0], 9, garbage=-50.0)
    h0, x_sum, s_sum = model(x, s0, mask)
    h1, _, _ = model(x, s1, mask)
    assert h0.shape == (3, model.out_dim) and torch.isfinite(h0).all()
    assert torch.allclose(h0, h1, atol=1e-5), "padding content leaked into the output"
    # row 1 alone, padded only to its own length, gives the same result as in the batch
    h_row, _, _ = model(x[1:2], s0[1:2, :2], mask[1:2, :2])
    assert torch.allclose(h_row, h0[1:2], atol=1e-5)
    h0.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_bad_flags_are_clear_errors():
    with pytest.raises(ValueError, match="interformer.gate"):
        InterFormer(4, D, WukongConfig(), InterFormerConfig(gate="relu"))
    with pytest.raises(ValueError, match="interformer.seq_norm"):
        InterFormer(4, D, WukongConfig(), InterFormerConfig(seq_norm="middle"))


def test_flops_match_counter():
    cfg = InterFormerConfig(num_layers=2)
    model = InterFormer(6, D, WukongConfig(n_fm=4, n_lin=2, k=2, cross_layer_attention=True), cfg)
    s, mask = _seq([20, 20], 20)
    with torch.no_grad(), flop_counter() as fc:
        model(torch.randn(2, 6, D), s, mask)
    measured = fc.get_total_flops() / 2
    assert abs(model.flops(20) - measured) / measured < 0.01
