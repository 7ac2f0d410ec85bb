"""The oneDNN dense-layer twin against its reference (F.linear): values and all three gradients."""

import pytest
import torch

from opengem.ops.linear import linear, onednn_takes
from twin_helpers import needs_onednn


def run(x, w, b, kernel, grads=(True, True, True)):
    leaves = [t.clone().requires_grad_(g) if t is not None else None for t, g in zip((x, w, b), grads)]
    out = linear(*leaves, kernel=kernel)
    g = torch.Generator().manual_seed(7)
    (out * torch.randn(out.shape, generator=g)).sum().backward()
    return out.detach(), [t.grad if t is not None else None for t in leaves]


CASES = [  # leading shape of x, in, out, bias
    ((512,), 64, 32, True),
    ((4, 33), 17, 5, False),  # 3-D input, odd sizes, no bias
    ((0,), 8, 4, True),  # empty batch
    ((1,), 1, 1, True),
    ((3, 0, 2), 6, 3, True),  # an empty middle dim
    ((256,), 1024, 512, True),  # a size where oneDNN's blocking differs from MKL's
    ((700,), 8, 4, True),  # rows > 16 x width: dW goes to mm (DW_MAX_ROWS_PER_WIDTH)
]


@needs_onednn
@pytest.mark.parametrize("lead,din,dout,bias", CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_onednn_linear_matches_reference_forward_and_backward(lead, din, dout, bias, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, din, generator=g)
    w = torch.randn(dout, din, generator=g) / din**0.5
    b = torch.randn(dout, generator=g) if bias else None
    out, grads = run(x, w, b, "onednn")
    ref, ref_grads = run(x, w, b, "pytorch")
    assert out.shape == ref.shape == (*lead, dout)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for name, got, want in zip(["x", "weight", "bias"], grads, ref_grads):
        assert (got is None) == (want is None), name
        if want is not None:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5 * max(1, lead[0] ** 0.5), msg=name)


@needs_onednn
def test_onednn_linear_reads_strided_inputs_and_skips_unneeded_grads():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 24, generator=g).t()  # [24, 40], a transposed view
    w = torch.randn(8, 40, generator=g)
    b = torch.randn(8, generator=g)
    out, grads = run(x, w, b, "onednn", grads=(False, True, False))
    ref, ref_grads = run(x, w, b, "pytorch", grads=(False, True, False))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert grads[0] is None and grads[2] is None
    torch.testing.assert_close(grads[1], ref_grads[1], rtol=1e-5, atol=1e-5)


@needs_onednn
def test_onednn_kernel_refuses_what_it_cannot_run():
    x, w = torch.randn(4, 3), torch.randn(2, 3)
    with pytest.raises(ValueError, match="fp32 CPU"):
        linear(x.double(), w.double(), kernel="onednn")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not onednn_takes(x, w)
        with pytest.raises(ValueError, match="autocast"):
            linear(x, w, kernel="onednn")
    with pytest.raises(ValueError, match="not one of"):
        linear(x, w, kernel="triton")


@needs_onednn
def test_onednn_linear_output_takes_an_in_place_relu():
    """The fused FMB MLP applies relu_ to each layer's output: the Function must not return a view."""
    x = torch.randn(16, 8, requires_grad=True)
    w = torch.randn(4, 8, requires_grad=True)
    y = linear(x, w, None, kernel="onednn").relu_()
    y.sum().backward()
    ref_x, ref_w = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    torch.nn.functional.linear(ref_x, ref_w).relu_().sum().backward()
    torch.testing.assert_close(x.grad, ref_x.grad)
    torch.testing.assert_close(w.grad, ref_w.grad)
