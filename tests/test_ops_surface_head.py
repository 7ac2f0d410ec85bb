"""The grouped per-surface head op against its per-example reference twin: values, gradients, FLOPs."""

import pytest
import torch

from opengem.model.flops import flop_counter
from opengem.ops.surface_head import discarded_flops_per_example, surface_head


def head_inputs(B, H, a, T, S, used, seed):
    """Random head inputs; surfaces are drawn from ``used`` only, so the others get no example."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, H, generator=g)
    surface = torch.tensor(used)[torch.randint(0, len(used), (B,), generator=g)]
    params = [torch.randn(S, H, T, generator=g), torch.randn(S, T, generator=g)]
    if a:
        params += [torch.randn(S, H, a, generator=g), torch.randn(S, a, generator=g),
                   torch.randn(S, a, H, generator=g) * 0.3]
    return h, surface, params


def run(h, surface, params, kernel):
    leaves = [t.clone().requires_grad_() for t in (h, *params)]
    out = surface_head(leaves[0], surface, *leaves[1:], kernel=kernel)
    g = torch.Generator().manual_seed(99)
    (out * torch.randn(out.shape, generator=g)).sum().backward()
    return out.detach(), [t.grad for t in leaves]


CASES = [  # B, H, a, T, S, surfaces that occur
    (1, 8, 4, 2, 3, [2]),  # batch 1
    (16, 12, 0, 1, 4, [0, 3]),  # no adapter; surfaces 1 and 2 empty
    (33, 10, 5, 3, 8, [1, 4, 5, 7]),  # odd sizes, half the surfaces empty
    (64, 16, 4, 2, 1, [0]),  # one surface
    (0, 6, 3, 2, 3, [0]),  # empty batch
]


@pytest.mark.parametrize("B,H,a,T,S,used", CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_grouped_head_matches_reference_forward_and_backward(B, H, a, T, S, used, seed):
    h, surface, params = head_inputs(B, H, a, T, S, used, seed)
    out, grads = run(h, surface, params, "fused")
    ref_out, ref_grads = run(h, surface, params, "pytorch")
    assert out.shape == ref_out.shape == (B, T)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    for name, g, r in zip(["h", "out_weight", "out_bias", "down", "down_bias", "up"], grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5, msg=name)
    for g in grads[1:]:  # surfaces without examples get exactly zero gradient, as in the reference
        empty = [s for s in range(S) if s not in used]
        assert (g[empty] == 0).all()


def test_grouped_head_under_bf16_autocast_stays_close_to_fp32():
    h, surface, params = head_inputs(256, 32, 8, 2, 4, [0, 1, 2, 3], 0)
    ref = surface_head(h, surface, *params, kernel="pytorch")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = surface_head(h, surface, *params)
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max() <= 0.05 * ref.abs().max()


def test_counted_flops_are_model_flops_plus_the_declared_discarded_surfaces():
    B, H, a, T, S = 8, 12, 4, 3, 5
    h, surface, params = head_inputs(B, H, a, T, S, list(range(S)), 0)
    with flop_counter() as fast:
        surface_head(h, surface, *params)
    with flop_counter() as ref:
        surface_head(h, surface, *params, kernel="pytorch")
    assert ref.get_total_flops() == B * (2 * H * a * 2 + 2 * H * T)
    assert fast.get_total_flops() - ref.get_total_flops() == B * discarded_flops_per_example(H, a, T, S)


def test_grouped_head_compiles_as_one_graph_and_fx_traces():
    """No host sync or data-dependent shape: torch.compile(fullgraph=True) takes it whole, and torch.fx
    symbolic tracing (what TorchRec's TrainPipelineSparseDist runs on a model) goes through it."""
    h, surface, params = head_inputs(16, 8, 4, 2, 3, [0, 2], 0)
    compiled = torch.compile(surface_head, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(h, surface, *params), surface_head(h, surface, *params))

    class Op(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p = torch.nn.ParameterList(params)

        def forward(self, x, s):
            return surface_head(x, s, *self.p)

    op = Op()
    traced = torch.fx.symbolic_trace(op)
    torch.testing.assert_close(traced(h, surface), op(h, surface))


def test_partial_adapter_and_unknown_kernel_are_refused():
    h, surface, params = head_inputs(4, 6, 2, 1, 2, [0, 1], 0)
    with pytest.raises(ValueError, match="adapter"):
        surface_head(h, surface, *params[:3])
    with pytest.raises(ValueError, match="kernel"):
        surface_head(h, surface, *params, kernel="triton")


def test_the_head_module_runs_the_kernel_it_is_set_to():
    from opengem.model.heads import HeadConfig, MultiSurfaceHead
    from opengem.model.sequence import use_kernel

    torch.manual_seed(0)
    head = MultiSurfaceHead(10, 3, 2, HeadConfig(hidden=[8], adapter_dim=4))
    assert head.kernel == "fused"
    x, surface = torch.randn(6, 10), torch.tensor([0, 2, 2, 0, 0, 2])
    fused = head(x, surface)[0]
    use_kernel(head, "pytorch")  # what GEM does with model.gem.kernel
    assert head.kernel == "pytorch" and head.discarded_flops_per_example() == 0
    with flop_counter() as c:
        ref = head(x, surface)[0]
    torch.testing.assert_close(fused, ref, rtol=1e-5, atol=1e-5)
    assert c.get_total_flops() == 6 * head.flops_per_example()  # the reference computes no other surface
