"""Fused Wukong FMB and layer combine against the reference, forward and backward.

Shapes: GEM-small's own (24 tokens, rank 8, MLP 192 -> 512 -> 256 -> 256), a shared and a per-example
(input-attentive) Y, an identity residual and a W_R one, no LCB tokens (nL = 0), batch 1, an empty batch,
and examples whose tokens are all zero (the "empty row" of a token batch: LN's variance is 0 there).
"""

from __future__ import annotations

import pytest
import torch

from opengem.model.sequence import use_kernel
from opengem.model.wukong import WukongConfig, WukongLayer
from opengem.ops import fmb as fmb_ops
from twin_helpers import assert_twins_equal, fmb_inputs, needs_onednn, rand, run_fwd_bwd, tokens

ATOL, RTOL = 2e-5, 1e-4


def _same(ref: tuple, fused: tuple) -> None:
    assert_twins_equal(ref, fused, ATOL, RTOL)


# (B, n, d, k, mlp dims after the input, zero rows, per-example y)
FMB_CASES = [
    (6, 24, 32, 8, [512, 256, 256], (1, 4), False),  # GEM-small's FMB, two all-zero examples
    (5, 7, 4, 3, [16, 12], (0,), True),  # input-attentive Y [B, n, k]
    (1, 5, 8, 2, [10], (), False),  # batch 1, one MLP layer
    (0, 5, 8, 2, [16, 10], (), False),  # an empty batch
]


@pytest.mark.parametrize("B,n,d,k,dims,zero_rows,per_example", FMB_CASES)
def test_fused_fmb_matches_reference_forward_and_backward(B, n, d, k, dims, zero_rows, per_example):
    inputs, call = fmb_inputs(B, n, d, k, dims, zero_rows, per_example)
    _same(run_fwd_bwd(call("pytorch"), inputs), run_fwd_bwd(call("fused"), inputs))


@pytest.mark.parametrize("B,n,d,n_fm,n_lin,residual_map,zero_rows", [
    (6, 24, 32, 8, 8, True, (2,)),  # GEM-small: 24 tokens in, 16 out (W_R)
    (4, 16, 32, 8, 8, False, (0, 3)),  # identity residual (n = nF + nL)
    (3, 6, 4, 6, 0, False, ()),  # no LCB tokens
    (1, 9, 4, 3, 2, True, ()),  # batch 1
    (0, 9, 4, 3, 2, True, ()),  # an empty batch
])
def test_fused_combine_matches_reference_forward_and_backward(B, n, d, n_fm, n_lin, residual_map, zero_rows):
    x = tokens(B, n, d, zero_rows)
    f = rand(B, n_fm, d, seed=6)
    w_lin = rand(n_lin, n, seed=7)
    w_res = rand(n_fm + n_lin, n, seed=8) if residual_map else None
    ln_w, ln_b = 1 + 0.1 * rand(d, seed=9), 0.1 * rand(d, seed=10)

    def call(kernel: str):  # noqa: ANN202
        return lambda f, x, wl, wr, lw, lb: fmb_ops.combine(f, x, wl, wr, lw, lb, kernel=kernel)

    inputs = [f, x, w_lin, w_res, ln_w, ln_b]
    _same(run_fwd_bwd(call("pytorch"), inputs), run_fwd_bwd(call("fused"), inputs))


@pytest.mark.parametrize("B,n,d,n_fm,n_lin,residual_map", [
    (6, 15, 4, 2, 2, True),  # the iso-FLOP study's 4-wide rung: 15 tokens in, 4 out
    (4, 6, 4, 4, 2, False),  # identity residual
    (0, 9, 4, 3, 2, True),  # an empty batch
])
def test_combine_without_layer_norm_is_the_plain_sum_under_both_kernels(B, n, d, n_fm, n_lin, residual_map):
    """``wukong.norm = "none"``: both kernels return concat(FMB, W_L·X) + residual, forward and backward."""
    x = tokens(B, n, d)
    f = rand(B, n_fm, d, seed=6)
    w_lin = rand(n_lin, n, seed=7)
    w_res = rand(n_fm + n_lin, n, seed=8) if residual_map else None

    def call(kernel: str):  # noqa: ANN202
        return lambda f, x, wl, wr: fmb_ops.combine(f, x, wl, wr, None, None, kernel=kernel)

    def plain(f, x, wl, wr):  # noqa: ANN001, ANN202
        res = x if wr is None else torch.einsum("mn,bnd->bmd", wr, x)
        return torch.cat([f, torch.einsum("ln,bnd->bld", wl, x)], dim=1) + res

    inputs = [f, x, w_lin, w_res]
    ref = run_fwd_bwd(plain, inputs)
    _same(ref, run_fwd_bwd(call("pytorch"), inputs))
    _same(ref, run_fwd_bwd(call("fused"), inputs))


def test_wukong_layer_without_norm_has_no_layer_norm():
    """``norm = "none"``: no LayerNorm parameters, and a token keeps its mean and length (the LCB and residual
    tokens are exactly W_R·X + W_L·X). Both kernels agree on it in the test below."""
    torch.manual_seed(0)
    layer = WukongLayer(9, 4, 4, 3, WukongConfig(n_fm=4, n_lin=3, k=3, mlp_dims=[16], norm="none"))
    assert layer.ln is None
    x = tokens(5, 9, 4, zero_rows=(2,))
    lin = torch.einsum("mn,bnd->bmd", layer.W_R, x)[:, 4:] + torch.einsum("ln,bnd->bld", layer.W_L, x)
    torch.testing.assert_close(layer(x)[:, 4:], lin)
    with pytest.raises(ValueError, match="wukong.norm: 'rms' is not one of layer, none"):
        WukongLayer(9, 4, 4, 3, WukongConfig(n_fm=4, n_lin=3, k=3, mlp_dims=[16], norm="rms"))


def test_combine_rejects_identity_residual_of_the_wrong_size():
    with pytest.raises(ValueError, match="identity residual"):
        fmb_ops.combine(torch.zeros(2, 3, 4), torch.zeros(2, 5, 4), torch.zeros(1, 5), None,
                        torch.ones(4), torch.zeros(4), kernel="fused")


def test_fmb_rejects_unknown_kernel_and_mismatched_layers():
    x, y = torch.zeros(2, 3, 4), torch.zeros(3, 2)
    w, b = [torch.zeros(5, 6)], [torch.zeros(5)]
    with pytest.raises(ValueError, match="kernel 'cuda' is not one of"):
        fmb_ops.fmb(x, y, torch.ones(6), torch.zeros(6), w, b, kernel="cuda")
    with pytest.raises(ValueError, match="kernel 'triton' is not one of"):  # combine has no Triton twin
        fmb_ops.combine(torch.zeros(2, 2, 4), x, torch.zeros(1, 3), None, torch.ones(4), torch.zeros(4),
                        kernel="triton")
    with pytest.raises(ValueError, match="one bias per MLP weight"):
        fmb_ops.fmb(x, y, torch.ones(6), torch.zeros(6), w, [], kernel="fused")


@pytest.mark.parametrize("attentive", [False, True])
@pytest.mark.parametrize("norm", ["layer", "none"])
def test_wukong_layer_same_numbers_under_both_kernels(attentive, norm):
    """One layer, the same weights: the reference and the fused path agree on outputs and every grad."""
    torch.manual_seed(0)
    cfg = WukongConfig(n_fm=4, n_lin=3, k=3, mlp_dims=[16], input_attentive_y=attentive, y_hidden=8,
                       norm=norm)
    layer = WukongLayer(9, 8, 4, 3, cfg)
    x = tokens(5, 9, 8, zero_rows=(2,))
    results = []
    for kernel in ("pytorch", "fused"):
        use_kernel(layer, kernel)
        layer.zero_grad()
        out, (gx,) = run_fwd_bwd(layer, [x])
        results.append((out, [gx, *(p.grad.clone() for p in layer.parameters())]))
    _same(*results)


def test_fused_wukong_layer_compiles_as_one_graph():
    """The fused path has no host sync or data-dependent shape: torch.compile(fullgraph=True) takes a whole
    Wukong layer (the per-layer compiled region of issue 13)."""
    torch.manual_seed(0)
    layer = use_kernel(WukongLayer(9, 8, 4, 3, WukongConfig(n_fm=4, n_lin=3, k=3, mlp_dims=[16])), "fused")
    x = tokens(5, 9, 8)
    compiled = torch.compile(layer, fullgraph=True, dynamic=False, backend="eager")
    torch.testing.assert_close(compiled(x), layer(x))


@needs_onednn
@pytest.mark.parametrize("B,n,d,k,dims,zero_rows,per_example",
                         [*FMB_CASES, (64, 24, 32, 8, [512, 256], (3,), False)])  # every layer >= MIN_MACS
def test_fused_fmb_with_onednn_mlp_matches_reference_forward_and_backward(B, n, d, k, dims, zero_rows,
                                                                          per_example):
    """``train.cpu_linear = onednn`` runs the fused FMB's MLP products through oneDNN: same math."""
    inputs, call = fmb_inputs(B, n, d, k, dims, zero_rows, per_example)
    L = len(dims)

    def onednn(x, y, lw, lb, *wb):
        return fmb_ops.fmb(x, y, lw, lb, list(wb[:L]), list(wb[L:]), kernel="fused", linear_kernel="onednn")

    _same(run_fwd_bwd(call("pytorch"), inputs), run_fwd_bwd(onednn, inputs))
