"""Wukong layer equations on hand-sized inputs, stack shapes/gradients, cross-layer attention, FLOPs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from opengem.model.flops import flop_counter
from opengem.model.wukong import WukongConfig, WukongLayer, WukongStack, layer_token_counts


def test_optimized_fm_hand_computed():
    cfg = WukongConfig(k=1, mlp_dims=[4])
    layer = WukongLayer(3, 2, 2, 1, cfg)
    with torch.no_grad():
        layer.Y.copy_(torch.tensor([[1.0], [0.0], [2.0]]))
    X = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
    # Xᵀ Y = [1·1 + 0·0 + 1·2, 0·1 + 1·0 + 1·2] = [3, 2];  X · (Xᵀ Y) = [3, 2, 5]
    assert layer.fm(X)[0, :, 0].tolist() == [3.0, 2.0, 5.0]


def test_layer_is_ln_of_fmb_lcb_plus_residual():
    torch.manual_seed(0)
    cfg = WukongConfig(k=2, mlp_dims=[8])
    layer = WukongLayer(4, 3, 2, 2, cfg)  # 4 tokens in, 2 + 2 out: plain residual
    assert layer.W_R is None
    X = torch.randn(2, 4, 3)
    with torch.no_grad():
        layer.W_L.copy_(torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 1.0, 0]]))
    lcb = torch.stack([X[:, 0], X[:, 1] + X[:, 2]], dim=1)  # W_L · X by hand
    z = (X @ (X.transpose(1, 2) @ layer.Y)).flatten(1)  # X (Xᵀ Y)
    fmb = layer.mlp(F.layer_norm(z, (8,), layer.fm_ln.weight, layer.fm_ln.bias)).view(2, 2, 3)
    expected = F.layer_norm(torch.cat([fmb, lcb], 1) + X, (3,), layer.ln.weight, layer.ln.bias)
    assert torch.allclose(layer(X), expected, atol=1e-5)


def test_residual_is_projected_when_token_count_changes():
    torch.manual_seed(0)
    layer = WukongLayer(5, 4, 2, 1, WukongConfig(k=2))
    assert layer.W_R is not None and layer.W_R.shape == (3, 5)
    X = torch.randn(2, 5, 4)
    with torch.no_grad():
        layer.W_L.zero_()
        layer.mlp[-1].weight.zero_()
        layer.mlp[-1].bias.zero_()
    # FMB = 0 and LCB = 0, so the output is LN(W_R · X)
    expected = F.layer_norm(torch.einsum("mn,bnd->bmd", layer.W_R, X), (4,), layer.ln.weight, layer.ln.bias)
    assert torch.allclose(layer(X), expected, atol=1e-5)


def test_input_attentive_y_shapes_and_gradient():
    layer = WukongLayer(6, 4, 3, 3, WukongConfig(k=2, input_attentive_y=True, y_hidden=8))
    assert layer.Y is None
    X = torch.randn(5, 6, 4, requires_grad=True)
    out = layer(X)
    assert out.shape == (5, 6, 4)
    out.sum().backward()
    assert all(p.grad is not None for p in layer.y_mlp.parameters())


@pytest.mark.parametrize("cla", [False, True])
def test_stack_shapes_gradients_and_pyramid(cla):
    cfg = WukongConfig(num_layers=3, n_fm=4, n_lin=4, k=2, mlp_dims=[16], pyramid=[8, 6, 4],
                       cross_layer_attention=cla)
    stack = WukongStack(7, 8, cfg)
    assert [lay.n_out for lay in stack.layers] == [8, 6, 4] and stack.out_tokens == 4
    X = torch.randn(3, 7, 8, requires_grad=True)
    out = stack(X)
    assert out.shape == (3, 4, 8)
    out.pow(2).sum().backward()
    assert X.grad is not None and all(p.grad is not None for p in stack.parameters())


def test_cross_layer_attention_reads_earlier_layers():
    torch.manual_seed(0)
    stack = WukongStack(4, 8, WukongConfig(num_layers=2, n_fm=2, n_lin=2, k=2, cross_layer_attention=True))
    X = torch.randn(2, 4, 8)
    base = stack(X)
    with torch.no_grad():
        stack.cla[1].attn.out.weight.zero_()
        stack.cla[1].attn.out.bias.zero_()
    assert not torch.allclose(stack(X), base)  # the last layer's attention over earlier layers mattered


def test_pyramid_split_and_errors():
    counts = layer_token_counts(WukongConfig(n_fm=8, n_lin=8, pyramid=[16, 8, 2]), 3)
    assert counts == [(8, 8), (4, 4), (1, 1)]
    with pytest.raises(ValueError, match="wukong.pyramid"):
        layer_token_counts(WukongConfig(pyramid=[8, 4]), 3)
    with pytest.raises(ValueError, match="expected 4 tokens"):
        WukongLayer(4, 2, 1, 1, WukongConfig())(torch.randn(1, 3, 2))


@pytest.mark.parametrize("attentive,cla", [(False, False), (True, True)])
def test_flops_match_counter(attentive, cla):
    cfg = WukongConfig(num_layers=3, n_fm=4, n_lin=3, k=3, mlp_dims=[32, 16], pyramid=[7, 5, 4],
                       input_attentive_y=attentive, cross_layer_attention=cla)
    stack = WukongStack(9, 8, cfg)
    with torch.no_grad(), flop_counter() as fc:
        stack(torch.randn(4, 9, 8))
    measured = fc.get_total_flops() / 4
    assert abs(stack.flops() - measured) / measured < 0.01
