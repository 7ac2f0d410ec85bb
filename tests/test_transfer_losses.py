"""Unit tests of the transfer losses, the auxiliary head's gradient routing and the Student Adapter."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from opengem.data.random_batch import random_batch
from opengem.data.schema import FeatureSchema
from opengem.model.registry import ModelConfig
from opengem.transfer.adapter import AdapterConfig, StudentAdapter
from opengem.transfer.distill import grad_scale, kd_bce, logit_mse, teacher_probs
from opengem.transfer.vertical import VerticalModel, VMSchemaConfig, derive_vm_schema
from opengem.transfer.vm_train import ArmConfig, kd_losses


def test_kd_bce_matches_manual_and_masks():
    s = torch.tensor([[0.3, -1.0], [2.0, 0.5]])
    t = torch.tensor([[1.0, float("nan")], [-0.5, 0.0]])
    m = torch.tensor([[True, True], [True, False]])
    T = 2.0
    got = kd_bce(s, t, m, temperature=T)
    rows = [(0, 0), (1, 0)]  # NaN teacher and masked entry excluded
    want = (
        sum(
            float(F.binary_cross_entropy_with_logits(s[i, j] / T, torch.sigmoid(t[i, j] / T)))
            for i, j in rows
        )
        / len(rows)
        * T**2
    )
    assert math.isclose(float(got), want, rel_tol=1e-5)


def test_kd_bce_minimised_at_teacher():
    t = torch.randn(64, 1)
    m = torch.ones(64, 1, dtype=torch.bool)
    s = torch.zeros(64, 1, requires_grad=True)
    opt = torch.optim.SGD([s], lr=200.0)  # the loss is a mean over 64 rows
    for _ in range(300):
        opt.zero_grad()
        kd_bce(s, t, m, temperature=1.0).backward()
        opt.step()
    assert torch.allclose(s.detach(), t, atol=0.05)


def test_label_scaling_and_temperature():
    t = torch.tensor([[0.0]])
    assert math.isclose(float(teacher_probs(t, 1.0, 0.5)), 0.25, rel_tol=1e-6)
    assert float(teacher_probs(torch.tensor([[4.0]]), 4.0)) == pytest.approx(
        float(torch.sigmoid(torch.tensor(1.0)))
    )
    with pytest.raises(ValueError, match="temperature"):
        teacher_probs(t, 0.0)


def test_logit_mse_and_teacher_detached():
    s = torch.tensor([[1.0, 2.0]], requires_grad=True)
    t = torch.tensor([[0.0, 5.0]], requires_grad=True)
    m = torch.tensor([[True, False]])
    loss = logit_mse(s, t, m)
    assert float(loss) == pytest.approx(1.0)
    loss.backward()
    assert t.grad is None and s.grad[0, 1] == 0


def test_grad_scale():
    x = torch.ones(3, requires_grad=True)
    (grad_scale(x, 0.25) * 2).sum().backward()
    assert torch.allclose(x.grad, torch.full((3,), 0.5))


def _tiny_vm(aux: bool) -> tuple[VerticalModel, object]:
    fm = FeatureSchema.load("configs/schemas/tiny.toml")
    vm = derive_vm_schema(fm, VMSchemaConfig(max_len=4))
    cfg = ModelConfig(name="dlrm")
    cfg.embedding.d = 8
    cfg.head.hidden = [16]
    torch.manual_seed(0)
    return VerticalModel(vm, cfg, aux_head=aux, aux_grad_scale=0.5), random_batch(vm, 16, seed=1)


def test_serving_head_gets_no_gradient_from_distillation():
    model, batch = _tiny_vm(aux=True)
    out = model(batch)
    arm = ArmConfig(kd_weight=1.0, kd_mse_weight=0.5, aux_head=True)
    t = {"logits": torch.randn_like(out.logits), "mask": torch.ones_like(out.logits, dtype=torch.bool)}
    loss = sum(fn(out, batch, t) for _, fn in kd_losses(arm))
    loss.backward()
    serving = model.serving_parameters()
    assert serving, "the serving head has parameters"
    assert all(p.grad is None or float(p.grad.abs().sum()) == 0 for p in serving)
    trunk = [p for n, p in model.named_parameters() if ".head.trunk." in n]
    assert any(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in trunk), "the trunk must learn"
    assert float(model.aux_head.weight.grad.abs().sum()) > 0


def test_plain_kd_does_reach_the_serving_head():
    """The counterpart: without the aux head, KD trains the serving head (so the test above can fail)."""
    model, batch = _tiny_vm(aux=False)
    out = model(batch)
    t = {"logits": torch.randn_like(out.logits), "mask": torch.ones_like(out.logits, dtype=torch.bool)}
    sum(fn(out, batch, t) for _, fn in kd_losses(ArmConfig(kd_weight=1.0))).backward()
    assert any(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in model.serving_parameters())


def test_aux_head_is_not_served():
    with_aux, _ = _tiny_vm(aux=True)
    without, _ = _tiny_vm(aux=False)
    assert with_aux.flops_per_example() == without.flops_per_example()


def test_adapter_starts_as_identity_and_output_is_stop_gradient():
    ad = StudentAdapter(2, 3, AdapterConfig())
    x = torch.randn(8, 2, requires_grad=True)
    s = torch.randint(0, 3, (8,))
    a = torch.rand(8)
    assert torch.allclose(ad(x, s, a), x)
    out = ad.corrected(x, s, a)
    assert not out.requires_grad
    student = torch.zeros(8, 2, requires_grad=True)
    kd_bce(student, out, torch.ones(8, 2, dtype=torch.bool)).backward()
    assert all(p.grad is None for p in ad.parameters()) and x.grad is None


def test_adapter_learns_a_surface_bias_and_stays_near_identity_without_one():
    rng = np.random.default_rng(0)
    n = 1500
    fm = rng.normal(-1.0, 1.0, size=(n, 1))
    surface = rng.integers(0, 2, n)
    age = np.zeros(n)
    y_true = (rng.random((n, 1)) < 1 / (1 + np.exp(-fm))).astype(np.float32)  # FM calibrated
    ad = StudentAdapter(1, 2, AdapterConfig(steps=80, lr=0.05))
    ad.fit(fm + np.where(surface == 1, 1.5, 0.0)[:, None], y_true, np.ones((n, 1), bool), surface, age)
    x = torch.tensor([[-1.0]] * 2, dtype=torch.float32)
    fixed = ad.corrected(x + torch.tensor([[0.0], [1.5]]), torch.tensor([0, 1]), torch.zeros(2))
    assert abs(float(fixed[1] - fixed[0])) < 0.5  # the +1.5 bias on surface 1 is mostly removed
    ident = StudentAdapter(1, 2, AdapterConfig(steps=80, lr=0.05))
    ident.fit(fm, y_true, np.ones((n, 1), bool), surface, age)
    xs = torch.linspace(-3, 1, 9)[:, None]
    dev = ident.corrected(xs, torch.zeros(9, dtype=torch.long), torch.zeros(9)) - xs
    assert float(dev.abs().max()) < 0.3


def test_adapter_init_is_seeded_not_global_rng():
    """A refit must not depend on what else consumed the global torch RNG (test order, other arms)."""
    torch.manual_seed(1)
    a = StudentAdapter(1, 2, AdapterConfig(seed=3))
    torch.manual_seed(2)
    b = StudentAdapter(1, 2, AdapterConfig(seed=3))
    c = StudentAdapter(1, 2, AdapterConfig(seed=4))
    assert torch.equal(a.net[0].weight, b.net[0].weight)
    assert not torch.equal(a.net[0].weight, c.net[0].weight)
