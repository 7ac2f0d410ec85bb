"""What a small model's step no longer pays for, each with the same result as before: the gradient
clip's per-tensor loop and setting every module's training flag (row-wise tables over one rank:
test_parallelize.py)."""

from __future__ import annotations

import torch
from torch import nn

from dist_helpers import ROOT, TINY
from opengem.data.random_batch import random_batch
from opengem.data.schema import FeatureSchema
from opengem.model.registry import build_model
from opengem.train.config import TrainConfig, load_run_config
from opengem.train.optim import clip_dense_gradients
from opengem.train.step import forward


def _grads(seed: int) -> list[nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    ps = [nn.Parameter(torch.randn(n, 7, generator=g)) for n in (1, 3, 16, 64)]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g) * 3
    return ps


def test_clip_returns_and_applies_the_per_tensor_norm_bit_for_bit():
    ps, ref = _grads(0), _grads(0)
    norm = clip_dense_gradients(ps, 1.0)
    want = torch.nn.utils.clip_grad_norm_(ref, 1.0, foreach=False)
    assert norm == float(want)
    for p, q in zip(ps, ref):
        assert torch.equal(p.grad, q.grad)
    assert norm > 1.0  # the clip did scale
    assert float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in ps]))) < 1.0 + 1e-5


def test_forward_puts_a_submodule_left_in_eval_back_into_training():
    """Only when some module is not training does the step set the flags; one left in eval (a caller's
    evaluation of a part) is still trained as training, dropout and running statistics included."""
    schema = FeatureSchema.load(ROOT / "configs" / "schemas" / "tiny.toml")
    cfg = load_run_config(TINY, ["train.progress=false"])
    torch.manual_seed(0)
    model = build_model(schema, cfg.model)
    model.eval()
    forward(model, random_batch(schema, 4, seed=0), TrainConfig(), torch.device("cpu"))
    assert all(m.training for m in model.modules())
    next(iter(model.children())).eval()
    forward(model, random_batch(schema, 4, seed=0), TrainConfig(), torch.device("cpu"))
    assert all(m.training for m in model.modules())
