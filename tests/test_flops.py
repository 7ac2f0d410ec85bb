from pathlib import Path

import pytest
import torch
from torch.utils import flop_counter as flop_counter_module
from torch.utils.flop_counter import FlopCounterMode

from opengem.data.batch import SequenceBatch
from opengem.data.random_batch import random_batch
from opengem.data.schema import FeatureSchema
from opengem.model.baselines import DCNv2Config, DINConfig, DLRMConfig
from opengem.model.embedding import EmbeddingConfig
from opengem.model.flops import (
    attention_flops,
    executed_flops_per_example,
    flop_counter,
    linear_flops,
    measured_flops,
    mlp_flops,
    model_flops,
)
from opengem.model.heads import HeadConfig
from opengem.model.registry import ModelConfig, build_model

TINY = Path(__file__).resolve().parents[1] / "configs" / "schemas" / "tiny.toml"


def full_length_batch(schema: FeatureSchema, batch_size: int, seq_len: int | None = None, seed: int = 0):
    """A random batch whose every history has exactly ``seq_len`` (default max_len) events."""
    b = random_batch(schema, batch_size, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    seqs = {}
    for grp in schema.sequences:
        L = grp.max_len if seq_len is None else seq_len
        n = batch_size * L
        seqs[grp.name] = SequenceBatch(
            lengths=torch.full((batch_size,), L, dtype=torch.long),
            ids={f.name: torch.randint(0, f.vocab, (n,), generator=g) for f in grp.id_fields},
            dense={f.name: torch.randn(n, generator=g) for f in grp.dense_fields},
        )
    b.sequences = seqs
    return b


def test_formula_helpers_match_flop_counter():
    lin = torch.nn.Linear(7, 5)
    x = torch.randn(3, 7)
    with FlopCounterMode(display=False) as c:
        lin(x)
    assert c.get_total_flops() == linear_flops(7, 5, rows=3)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    with FlopCounterMode(display=False) as c:
        net(torch.randn(6, 4))
    assert c.get_total_flops() == mlp_flops([4, 8, 2], rows=6)
    q, k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 9, 4), torch.randn(2, 3, 9, 4)
    with FlopCounterMode(display=False) as c:
        torch.softmax(q @ k.transpose(-1, -2), -1) @ v
    assert c.get_total_flops() == 2 * attention_flops(5, 9, 4, heads=3)


def test_flop_counter_counts_cpu_attention_without_touching_torchs_registry():
    """The CPU flash-attention formula lives in one counter, not in torch's global registry (no import side
    effect: this module imported every model module through ``build_model``)."""
    sdpa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    assert sdpa not in flop_counter_module.flop_registry
    q, k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 9, 4), torch.randn(2, 3, 9, 4)
    with flop_counter() as c:
        torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert c.get_total_flops() == 2 * attention_flops(5, 9, 4, heads=3)
    with FlopCounterMode(display=False) as plain:
        torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert plain.get_total_flops() == 0
    assert sdpa not in flop_counter_module.flop_registry


CONFIGS = {
    "lr": ModelConfig(name="lr"),
    "dlrm": ModelConfig(name="dlrm"),
    "dlrm_small": ModelConfig(
        name="dlrm",
        embedding=EmbeddingConfig(d=8, group_small=False),
        dlrm=DLRMConfig(bottom_mlp=[], top_mlp=[16]),
    ),
    "dcnv2": ModelConfig(name="dcnv2"),
    "dcnv2_lowrank_stacked": ModelConfig(name="dcnv2", dcnv2=DCNv2Config(low_rank=8, structure="stacked")),
    "din": ModelConfig(name="din"),
    "din_softmax": ModelConfig(
        name="din",
        head=HeadConfig(hidden=[32, 16], adapter_dim=0),
        din=DINConfig(softmax=True, attention_mlp=[8]),
    ),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_analytic_flops_match_flop_counter(name):
    schema = FeatureSchema.load(TINY)
    torch.manual_seed(0)
    m = build_model(schema, CONFIGS[name])
    analytic = model_flops(m)
    measured = measured_flops(m, full_length_batch(schema, 4))
    assert analytic > 0
    assert abs(analytic - measured) <= 0.10 * measured, (analytic, measured)
    # shorter full-length histories: seq_len is honoured
    short = measured_flops(m, full_length_batch(schema, 4, seq_len=5))
    assert abs(model_flops(m, 5) - short) <= 0.10 * short


def test_sequence_length_changes_flops_of_sequence_models():
    schema = FeatureSchema.load(TINY)
    m = build_model(schema, ModelConfig(name="din"))
    assert model_flops(m, 12) > model_flops(m, 2)
    with pytest.raises(TypeError, match="flops_per_example"):
        model_flops(torch.nn.Linear(2, 2))


def test_executed_flops_count_each_history_at_its_own_length():
    schema = FeatureSchema.load(TINY)
    torch.manual_seed(0)
    gem = build_model(schema, ModelConfig(name="gem"))
    batch = full_length_batch(schema, 4)
    lengths = torch.tensor([0, 3, 3, 12])
    for sb in batch.sequences.values():
        sb.lengths = lengths
    expected = sum(model_flops(gem, int(L)) for L in lengths) / 4
    assert executed_flops_per_example(gem, [batch]) == pytest.approx(expected)
    assert executed_flops_per_example(gem, [batch]) < model_flops(gem)
    full = full_length_batch(schema, 4)
    assert executed_flops_per_example(gem, [full, full]) == model_flops(gem)
    # a model whose FLOPs do not depend on histories, and an empty input
    dcn = build_model(schema, ModelConfig(name="dcnv2"))
    batch.sequences = {}
    assert executed_flops_per_example(dcn, [batch]) == model_flops(dcn)
    with pytest.raises(ValueError, match="no examples"):
        executed_flops_per_example(gem, [])
