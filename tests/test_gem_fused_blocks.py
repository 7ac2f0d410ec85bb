"""GEM blocks whose fused kernel changes how they compute, not what: the InterFormer summaries (CLS and
recent tokens in one gather), cross-layer attention (no one-element cat) and the Wukong layer (ops.fmb).

Each test flips one module's kernel (same weights) and compares outputs and every gradient on random
right-padded sequences with empty rows (only the CLS tokens real), rows shorter than ``n_recent``, full
rows and batch 1.
"""

from __future__ import annotations

import pytest
import torch

from opengem.model.interformer import CrossArch, InterFormer, InterFormerConfig
from opengem.model.sequence import use_kernel
from opengem.model.wukong import CrossLayerAttention, WukongConfig

ATOL, RTOL = 2e-5, 1e-4


def _seq(lengths: list[int], n_cls: int, L: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, n_cls + L, d] tokens (CLS first) and the mask: CLS real, then each row's ``lengths[b]`` events."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(lengths)
    mask = torch.cat([torch.ones(len(lengths), n_cls, dtype=torch.bool),
                      torch.arange(L)[None, :] < lens[:, None]], dim=1)
    return torch.randn(len(lengths), n_cls + L, d, generator=g) * mask[..., None], mask


def _both(module: torch.nn.Module, inputs: list[torch.Tensor], run) -> list:  # noqa: ANN001
    results = []
    for kernel in ("pytorch", "fused"):
        use_kernel(module, kernel)
        module.zero_grad()
        leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
        outs = run(*leaves)
        loss = sum((o * torch.linspace(-1, 1, o.numel()).view(o.shape)).sum() for o in outs)
        loss.backward()
        grads = [x.grad for x in leaves] + [p.grad.clone() for p in module.parameters() if p.grad is not None]
        results.append(([o.detach() for o in outs], grads))
    return results


def _assert_same(results: list) -> None:
    (o_ref, g_ref), (o_fused, g_fused) = results
    assert len(o_ref) == len(o_fused) and len(g_ref) == len(g_fused)
    for a, b in zip(o_ref + g_ref, o_fused + g_fused):
        torch.testing.assert_close(b, a, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("lengths", [[0, 1, 5, 9, 3], [0], [9], [2, 0, 0]])
@pytest.mark.parametrize("n_pma,n_recent", [(2, 2), (0, 3), (2, 12)])
def test_cross_arch_summaries_same_under_both_kernels(lengths, n_pma, n_recent):
    torch.manual_seed(0)
    cfg = InterFormerConfig(n_cls=3, n_pma=n_pma, n_recent=n_recent, num_heads=2)
    arch = CrossArch(5, 8, cfg)
    s, mask = _seq(lengths, 3, 9, 8, seed=1)
    x = torch.randn(len(lengths), 5, 8, generator=torch.Generator().manual_seed(2))
    _assert_same(_both(arch, [x, s], lambda x, s: arch(x, s, mask)))


@pytest.mark.parametrize("pieces", [1, 3])
def test_cross_layer_attention_same_under_both_kernels(pieces):
    torch.manual_seed(0)
    cla = CrossLayerAttention(8, 2)
    g = torch.Generator().manual_seed(3)
    inputs = [torch.randn(4, 6, 8, generator=g)] + [torch.randn(4, 5, 8, generator=g) for _ in range(pieces)]
    _assert_same(_both(cla, inputs, lambda x, *mem: [cla(x, list(mem))]))


def test_interformer_stack_same_under_both_kernels():
    """All of it together: summaries, CLA, the fused FMB, on a batch with an empty row and batch 1."""
    torch.manual_seed(0)
    model = InterFormer(6, 8, WukongConfig(n_fm=3, n_lin=3, k=2, mlp_dims=[16]),
                        InterFormerConfig(num_layers=3, n_cls=2, n_pma=1, n_recent=2, num_heads=2))
    for lengths in ([0, 4, 7, 1], [7]):
        seq, mask = _seq(lengths, 0, 7, 8, seed=4)
        x = torch.randn(len(lengths), 6, 8, generator=torch.Generator().manual_seed(5))
        _assert_same(_both(model, [x, seq], lambda x, seq, mask=mask: list(model(x, seq, mask))))
