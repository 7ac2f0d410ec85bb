"""The head's context term (model.head.context): a zero-initialised per-(surface, task) linear term on the
request's dense / clock inputs, added to each example's own surface's logit."""

import pytest
import torch

from opengem.config import ConfigError
from opengem.data.random_batch import random_batch
from opengem.data.sim_config import SimConfig, sim_schema
from opengem.model.heads import HeadConfig, MultiSurfaceHead, context_columns
from opengem.model.registry import MODEL_NAMES, ModelConfig, build_model
from opengem.ops.kernel import Kernel

SCHEMA = sim_schema(SimConfig(users=500, ads=200, topics=10, seq_max=8, seq_mean=4.0))


def test_context_columns_name_the_clock_or_every_dense_input():
    names = SCHEMA.dense_input_names
    assert [names[i] for i in range(*context_columns(SCHEMA, "time").indices(len(names)))] == \
        ["hour_of_day_sin", "hour_of_day_cos"]
    assert context_columns(SCHEMA, "dense") == slice(0, len(names))
    assert context_columns(SCHEMA, "none") == slice(0, 0)
    no_clock = sim_schema(SimConfig(hour_rate_amp=0.0))
    assert context_columns(no_clock, "time") == slice(no_clock.num_dense_inputs, no_clock.num_dense_inputs)
    with pytest.raises(ConfigError, match="head.context: 'hour'"):
        context_columns(SCHEMA, "hour")


def test_unknown_context_is_a_config_error_naming_the_key():
    cfg = ModelConfig(name="dcnv2")
    cfg.head.context = "clock"
    with pytest.raises(ConfigError, match=r"model\.head\.context: 'clock' is not one of none, time, dense"):
        build_model(SCHEMA, cfg, where="model")


@pytest.mark.parametrize("kernel", [Kernel.FUSED, Kernel.PYTORCH])
def test_each_row_adds_its_own_surfaces_term_and_only_it_gets_gradient(kernel):
    torch.manual_seed(0)
    head = MultiSurfaceHead(10, 3, 2, HeadConfig(hidden=[8], adapter_dim=4), context_dim=5)
    head.kernel = kernel
    plain = MultiSurfaceHead(10, 3, 2, HeadConfig(hidden=[8], adapter_dim=4))
    plain.load_state_dict({k: v for k, v in head.state_dict().items() if k != "context_weight"})
    plain.kernel = kernel
    x, c = torch.randn(7, 10), torch.randn(7, 5)
    surface = torch.tensor([0, 1, 2, 2, 1, 0, 0])
    assert torch.equal(head(x, surface, c)[0], plain(x, surface)[0])  # zero-initialised: starts as before
    with torch.no_grad():
        head.context_weight.normal_()
    logits = head(x, surface, c)[0]
    want = plain(x, surface)[0] + torch.stack([c[i] @ head.context_weight[s] for i, s in enumerate(surface)])
    torch.testing.assert_close(logits, want)
    only0 = surface == 0
    head(x[only0], surface[only0], c[only0])[0].sum().backward()
    grad = head.context_weight.grad
    assert grad[0].abs().sum() > 0 and (grad[1:] == 0).all()
    torch.testing.assert_close(grad[0], c[only0].sum(0)[:, None].expand(5, 2))


def test_a_head_with_context_refuses_a_missing_or_misshapen_context():
    head = MultiSurfaceHead(6, 2, 2, HeadConfig(hidden=[4], adapter_dim=0), context_dim=3)
    x, s = torch.randn(4, 6), torch.tensor([0, 1, 1, 0])
    with pytest.raises(ValueError, match=r"head context has shape None, expected \[4, 3\]"):
        head(x, s)
    with pytest.raises(ValueError, match=r"head context has shape \(4, 2\)"):
        head(x, s, torch.randn(4, 2))
    assert "context_weight" in head.state_dict() and head.state_dict()["context_weight"].shape == (2, 3, 2)
    assert "context_weight" not in MultiSurfaceHead(6, 2, 2, HeadConfig(hidden=[4])).state_dict()


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_model_feeds_its_clock_inputs_to_the_head(name):
    """The model passes the batch's clock columns: the context term moves a row's logit by exactly
    c . V_s, and the FLOP count grows by the term's own products."""
    torch.manual_seed(0)
    cfg = ModelConfig(name=name)
    cfg.head.context = "time"
    model = build_model(SCHEMA, cfg).eval()
    base = build_model(SCHEMA, ModelConfig(name=name)).eval()
    head = next(m for m in model.modules() if isinstance(m, MultiSurfaceHead))
    assert head.context_dim == 2
    batch = random_batch(SCHEMA, 32)
    with torch.no_grad():
        before = model(batch).logits
        head.context_weight.normal_()
        after = model(batch).logits
    cols = context_columns(SCHEMA, "time")
    term = torch.stack([batch.dense[i, cols] @ head.context_weight[s] for i, s in enumerate(batch.surface)])
    torch.testing.assert_close(after - before, term, rtol=1e-4, atol=1e-5)
    T = len(SCHEMA.tasks)
    assert model.flops_per_example() - base.flops_per_example() == 2 * 2 * T
