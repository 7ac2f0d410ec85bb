"""The FM's sequence encoder shared into a VM: copied weights, frozen training, serving FLOPs, gradients."""

from __future__ import annotations

import pytest
import torch

from opengem.data.random_batch import random_batch
from opengem.data.schema import FeatureSchema
from opengem.model.flops import linear_flops
from opengem.model.registry import ModelConfig, build_model
from opengem.transfer.vertical import VerticalModel, VMSchemaConfig, derive_vm_schema


def _fm_and_vm(sequence_fields: list[str] | None = None) -> tuple[torch.nn.Module, VerticalModel, object]:
    schema = FeatureSchema.load("configs/schemas/tiny.toml")
    fcfg = ModelConfig(name="gem")
    fcfg.embedding.d = 16
    fcfg.gem.sequence.kind = "full"
    fcfg.gem.sequence.full_layers = 1
    torch.manual_seed(0)
    fm = build_model(schema, fcfg)
    vm_schema = derive_vm_schema(schema, VMSchemaConfig(max_len=4, sequence_fields=sequence_fields or []))
    vcfg = ModelConfig(name="dlrm")
    vcfg.embedding.d = 8
    vcfg.head.hidden = [16]
    vm = VerticalModel(vm_schema, vcfg)
    return fm, vm, random_batch(vm_schema, 16, seed=1)


def test_shared_weights_equal_fm_and_stay_frozen_in_training():
    fm, vm, batch = _fm_and_vm()
    names = set(vm.attach_shared_history(fm))
    sh = vm.shared_history
    assert names and not any(".proj." in n for n in names)
    fm_enc = dict(fm.encoder.named_parameters())
    for n, p in sh.encoder.named_parameters():
        assert torch.equal(p, fm_enc[n]), n
    assert torch.equal(sh.group_type, fm.group_type)
    w_fm = next(p for n, p in fm.named_parameters() if n.endswith("embeddings.item.weight"))
    assert torch.equal(sh.tables["item"].weight, w_fm)
    for n, p in vm.named_parameters():
        if n in names:
            p.requires_grad_(False)
    before = {n: p.detach().clone() for n, p in vm.named_parameters()}
    opt = torch.optim.AdamW([p for p in vm.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        vm(batch).logits.sum().backward()
        opt.step()
    after = dict(vm.named_parameters())
    for n in names:
        assert torch.equal(after[n], before[n]), n
    assert not torch.equal(after["shared_history.proj.weight"], before["shared_history.proj.weight"])
    for n, p in sh.encoder.named_parameters():  # the FM itself is untouched too
        assert torch.equal(p, fm_enc[n]), n


def test_serving_flops_grow_by_encoder_and_projection():
    fm, vm, _ = _fm_and_vm()
    base = vm.flops_per_example()
    vm.attach_shared_history(fm)
    L = vm.schema.sequence("hist").max_len
    d, H = 16, vm.base.head.in_dim
    seq_in = 8 + 4 + 1  # item dim + action dim + dt
    want = fm.encoder.flops(L) + linear_flops(seq_in, d, rows=L) + linear_flops(d, H)
    assert fm.encoder.flops(L) > 0
    assert vm.flops_per_example() - base == want


def test_gradient_reaches_projection_and_output_changes():
    fm, vm, batch = _fm_and_vm(sequence_fields=["item"])  # dropped fields enter as zeros
    plain = vm(batch).logits.detach()
    vm.attach_shared_history(fm)
    out = vm(batch)
    assert not torch.allclose(out.logits, plain)
    out.logits.sum().backward()
    g = vm.shared_history.proj.weight.grad
    assert g is not None and g.abs().sum() > 0


def test_fm_without_gem_is_a_clear_error():
    _, vm, _ = _fm_and_vm()
    with pytest.raises(ValueError, match="not a GEM"):
        vm.attach_shared_history(vm.base)
