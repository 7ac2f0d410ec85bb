"""Under CPU bf16 autocast GEM's thin products run in fp32 (ops/cpu_autocast.py: the sequence side, the fused
FMB's X·(XᵀY) and token mixing) while the wide ones (Wukong's MLP) stay in bf16; without autocast nothing
changes."""

from __future__ import annotations

import pytest
import torch

from opengem.config import ConfigError
from opengem.model.interformer import InterFormerConfig, SequenceArch
from opengem.model.sequence import SequenceEncoder, SequenceEncoderConfig, use_kernel
from opengem.model.wukong import CrossLayerAttention, WukongConfig, WukongLayer
from opengem.ops import fmb
from opengem.ops.cpu_autocast import current_thin, thin_products
from opengem.train.config import load_run_config
from opengem.train.memory import apply_activation_checkpointing, autocast
from twin_helpers import rand


def _seq(B: int, L: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([0, 1, L, 3][:B])
    mask = torch.arange(L)[None, :] < lengths[:, None]
    return rand(B, L, d, seed=1) * mask[..., None], mask


def test_sequence_arch_under_cpu_bf16_autocast_equals_fp32_forward_and_backward():
    torch.manual_seed(0)
    arch = use_kernel(SequenceArch(8, InterFormerConfig(n_cls=2, num_heads=2)), "fused")
    s, mask = _seq(4, 6, 8)
    x_sum = rand(4, 2, 8, seed=2)
    results = []
    for bf16 in (False, True):
        arch.zero_grad()
        leaves = [t.detach().clone().requires_grad_(True) for t in (x_sum, s)]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = arch(*leaves, mask)
        assert out.dtype == torch.float32
        (out * rand(*out.shape, seed=3)).sum().backward()
        grads = [p.grad.clone() for p in arch.parameters()]
        results.append([out.detach(), *(t.grad for t in leaves), *grads])
    for a, b in zip(*results):
        torch.testing.assert_close(b, a, atol=0, rtol=0)  # the same fp32 computation, bit for bit
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a bf16 input (a Wukong output) is cast at entry
        assert arch(x_sum.bfloat16(), s, mask).dtype == torch.float32

def test_encoder_and_cross_layer_attention_return_fp32_but_wukong_mlp_runs_in_bf16():
    torch.manual_seed(0)
    enc = SequenceEncoder(8, 32, SequenceEncoderConfig(window=4, pool_tokens=2, chunk=4, num_heads=2))
    cla = CrossLayerAttention(8, 2)
    wk = WukongLayer(5, 8, 2, 2, WukongConfig(mlp_dims=[16]))
    s, mask = _seq(3, 32, 8)
    x = rand(3, 5, 8, seed=3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        values, _ = enc(s, mask, rand(3, 8, seed=4))
        y = wk(x)
        z = cla(y, [x.bfloat16(), y])
    assert values.dtype == torch.float32 and z.dtype == torch.float32
    assert y.dtype == torch.bfloat16  # the Wukong layer's products still use the bf16 matrix units


def test_fused_fmb_thin_products_in_fp32_and_mlp_in_bf16_under_cpu_autocast():
    x, y = rand(3, 5, 8, seed=6), rand(5, 4, seed=7)
    w1, b1, w2, b2 = rand(16, 20, seed=8), rand(16, seed=9), rand(24, 16, seed=10), rand(24, seed=11)
    ln_w, ln_b = torch.ones(20), torch.zeros(20)
    w_lin, w_res = rand(2, 5, seed=12), rand(5, 5, seed=13)
    plain = fmb.fm_product(x, y, kernel="fused")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        product = fmb.fm_product(x.bfloat16(), y, kernel="fused")
        mlp = fmb.fmb(x, y, ln_w, ln_b, [w1, w2], [b1, b2], 1e-5, kernel="fused")
        mixed = fmb.combine(mlp.view(3, 3, 8), x, w_lin, w_res, torch.ones(8), torch.zeros(8), 1e-5,
                            kernel="fused")
    assert product.dtype == torch.float32 and mixed.dtype == torch.float32
    expected = fmb.fm_product(x.bfloat16().float(), y, kernel="fused")  # fp32 math on the rounded input
    torch.testing.assert_close(product, expected, atol=0, rtol=0)
    assert not torch.equal(product, plain)  # the bf16 input was really cast (its rounding shows)
    assert mlp.dtype == torch.bfloat16  # the MLP's products use the bf16 matrix units


def test_thin_products_bf16_leaves_the_thin_blocks_to_autocast_and_fp32_is_restored_after():
    arch = use_kernel(SequenceArch(8, InterFormerConfig(n_cls=2, num_heads=2)), "fused")
    s, mask = _seq(4, 6, 8)
    x_sum = rand(4, 2, 8, seed=2)
    x, y = rand(3, 5, 8, seed=6), rand(5, 4, seed=7)
    fp32 = arch(x_sum, s, mask).detach()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with thin_products("bf16"):
            assert current_thin() == "bf16"
            out = arch(x_sum, s, mask)  # fp32 out (its residual adds the fp32 input), bf16 products inside
            assert out.dtype == torch.float32 and not torch.equal(out.detach(), fp32)
            assert fmb.fm_product(x, y, kernel="fused").dtype == torch.bfloat16
        assert current_thin() == "fp32"
        torch.testing.assert_close(arch(x_sum, s, mask).detach(), fp32, atol=0, rtol=0)  # the default again
        with thin_products("fp32"):
            assert fmb.fm_product(x, y, kernel="fused").dtype == torch.float32
    with pytest.raises(ValueError, match="cpu_bf16_thin"):
        with thin_products("fp16"):
            pass


def _cla_grads_under_thin_bf16(ac: bool, compiled: bool = False) -> list[torch.Tensor]:
    """The input's and parameters' gradients of one cross-layer attention step under bf16 autocast with
    ``thin="bf16"``, with activation checkpointing and torch.compile (aot_eager) on or off."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(CrossLayerAttention(8, 2))
    if ac:
        apply_activation_checkpointing(model, "layer", types=(CrossLayerAttention,))
    cla = model[0]
    run = torch.compile(cla, backend="aot_eager") if compiled else cla
    x = rand(3, 5, 8, seed=3).requires_grad_(True)
    with autocast("bf16", torch.device("cpu"), thin="bf16"):
        out = run(x, [x])
    out.sum().backward()
    return [x.grad.clone(), *(p.grad.clone() for p in cla.parameters())]


def test_activation_checkpointing_recomputes_under_the_forwards_thin_choice():
    # the recompute runs in backward, after the step's thin_products has exited: it must take the forward's
    # path (bf16 products), or the recomputed tensors' dtypes differ from the saved ones
    for a, b in zip(_cla_grads_under_thin_bf16(ac=False), _cla_grads_under_thin_bf16(ac=True)):
        torch.testing.assert_close(b, a, atol=0, rtol=0)


def test_compiled_activation_checkpointing_takes_the_thin_choice_too():
    # dynamo refuses a checkpoint context_fn other than selective checkpointing's: compiled, the region is
    # traced under the choice in force and its recompute replays the graph, so it must not pass one
    eager, compiled = (_cla_grads_under_thin_bf16(ac=True, compiled=c) for c in (False, True))
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(b, a, atol=1e-2, rtol=1e-2)  # bf16 products either way


def test_cpu_bf16_thin_is_a_checked_train_key():
    cfg = load_run_config("configs/tiny.toml", ["train.cpu_bf16_thin=\"bf16\""])
    assert cfg.train.cpu_bf16_thin == "bf16"
    with pytest.raises(ConfigError, match="train.cpu_bf16_thin"):
        load_run_config("configs/tiny.toml", ["train.cpu_bf16_thin=\"fp16\""])
