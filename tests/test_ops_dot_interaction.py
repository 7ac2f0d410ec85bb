"""DLRM's pairwise dot interaction: the fused form (slices, for exported graphs) against its bmm reference
twin, values and gradients, and which form a trace gets."""

import pytest
import torch

from opengem.ops.dot_interaction import dot_interaction
from opengem.ops.kernel import Kernel, export_for_inductor, inductor_kernel


def run(x, kernel):
    leaf = x.clone().requires_grad_()
    out = dot_interaction(leaf, kernel=kernel)
    g = torch.Generator().manual_seed(7)
    (out * torch.randn(out.shape, generator=g)).sum().backward()
    return out.detach(), leaf.grad


@pytest.mark.parametrize("B,n,d", [(1, 2, 1), (5, 3, 4), (33, 8, 8), (64, 21, 16), (0, 6, 8)])
@pytest.mark.parametrize("seed", [0, 1])
def test_fused_equals_reference_forward_and_backward(B, n, d, seed):
    x = torch.randn(B, n, d, generator=torch.Generator().manual_seed(seed))
    ref, ref_grad = run(x, Kernel.PYTORCH)
    out, grad = run(x, Kernel.FUSED)
    assert out.shape == ref.shape == (B, n * (n - 1) // 2)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-5)
    i, j = torch.triu_indices(n, n, offset=1)  # the documented order: every pair i < j, row by row
    torch.testing.assert_close(ref, (x[:, i] * x[:, j]).sum(-1), rtol=1e-5, atol=1e-5)


def test_one_vector_has_no_pairs_and_bad_shapes_are_refused():
    x = torch.randn(4, 1, 3)
    for kernel in (Kernel.PYTORCH, Kernel.FUSED):
        assert dot_interaction(x, kernel=kernel).shape == (4, 0)
    with pytest.raises(ValueError, match=r"x must be \[B, n, d\]"):
        dot_interaction(torch.randn(4, 3))
    with pytest.raises(ValueError, match="kernel 'triton' is not one of"):
        dot_interaction(x, kernel="triton")


class _Pairs(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dot_interaction(x, kernel=inductor_kernel())


def test_a_graph_exported_for_inductor_gets_the_fused_form_and_every_other_the_reference():
    assert inductor_kernel() is Kernel.PYTORCH
    x = torch.randn(16, 5, 4)
    plain = torch.export.export(_Pairs(), (x,), strict=False)  # a program run as it is: the reference
    with export_for_inductor():
        assert inductor_kernel() is Kernel.PYTORCH  # (not tracing: eager)
        fused = torch.export.export(_Pairs(), (x,), strict=False)
    for program, has_bmm in ((plain, True), (fused, False)):
        targets = {str(node.target) for node in program.graph.nodes}
        assert any("bmm" in t for t in targets) is has_bmm
        torch.testing.assert_close(program.module()(x), _Pairs()(x), rtol=1e-5, atol=1e-5)
