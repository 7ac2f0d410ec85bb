"""cross_width: the cross branch's own, wider embeddings of small-vocabulary features (GEM and DCNv2)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from opengem.config import ConfigError
from opengem.data.random_batch import random_batch
from opengem.data.schema import FeatureSchema
from opengem.model.baselines import DCNv2, DCNv2Config
from opengem.model.cross_attributes import SURFACE, CrossAttributes, cross_attribute_fields
from opengem.model.embedding import EmbeddingConfig
from opengem.model.flops import measured_flops
from opengem.model.gem import GEM, GEMConfig
from opengem.model.heads import HeadConfig, masked_bce
from opengem.model.interformer import InterFormerConfig
from opengem.model.wukong import WukongConfig

TINY = Path(__file__).resolve().parents[1] / "configs" / "schemas" / "tiny.toml"


@pytest.fixture
def schema() -> FeatureSchema:
    return FeatureSchema.from_dict(tomllib.loads(TINY.read_text()))


def _gem(**over) -> GEMConfig:
    return GEMConfig(wukong=WukongConfig(n_fm=2, n_lin=2, k=2, mlp_dims=[16]),
                     interformer=InterFormerConfig(num_layers=1), **over)


def test_fields_are_the_small_single_valued_features(schema):
    # tiny.toml: user_id 100, ad_id 50, ad_category 10, user_interests 10 (multi-valued: never a field)
    assert cross_attribute_fields(schema, 1000) == ["user_id", "ad_id", "ad_category"]
    assert cross_attribute_fields(schema, 50) == ["ad_id", "ad_category"]
    assert cross_attribute_fields(schema, 5) == []


def test_lookups_are_each_rows_own_rows_then_the_surface(schema):
    torch.manual_seed(0)
    attrs = CrossAttributes(schema, width=6, max_vocab=50)
    batch = random_batch(schema, 7)
    out = attrs(batch)
    assert out.shape == (7, 3 * 6) and attrs.out_dim == 18
    feats = batch.sparse.to_dict()
    for k, name in enumerate(["ad_id", "ad_category"]):
        ids = feats[name].values()
        assert torch.equal(out[:, 6 * k: 6 * (k + 1)], attrs.tables[name].weight[ids])
    assert torch.equal(out[:, 12:], attrs.tables[SURFACE].weight[batch.surface])


def test_a_row_without_an_id_reads_zeros(schema):
    attrs = CrossAttributes(schema, width=4, max_vocab=50)
    batch = random_batch(schema, 3)
    feats = batch.sparse.to_dict()
    keys = batch.sparse.keys()
    values, lengths = [], []
    for key in keys:  # row 1 has no ad_category
        jt = feats[key]
        vals, lens = list(jt.values().tolist()), jt.lengths().tolist()
        if key == "ad_category":
            start = lens[0]
            vals = vals[:start] + vals[start + lens[1]:]
            lens[1] = 0
        values += vals
        lengths += lens
    batch.sparse = KeyedJaggedTensor.from_lengths_sync(keys, torch.tensor(values), torch.tensor(lengths))
    out = attrs(batch)
    assert torch.count_nonzero(out[1, 4:8]) == 0 and torch.count_nonzero(out[0, 4:8]) > 0


@pytest.mark.parametrize("family", ["gem", "dcnv2"])
def test_cross_width_widens_the_cross_input_and_every_table_trains(schema, family):
    torch.manual_seed(0)
    emb, head = EmbeddingConfig(d=8), HeadConfig(hidden=[16])
    if family == "gem":
        plain = GEM(schema, emb, head, _gem(cross_layers=2, cross_rank=4))
        model = GEM(schema, emb, head, _gem(cross_layers=2, cross_rank=4, cross_width=6, cross_vocab=50))
    else:
        plain = DCNv2(schema, emb, head, DCNv2Config(num_cross_layers=2, deep_mlp=[16]))
        model = DCNv2(schema, emb, head, DCNv2Config(num_cross_layers=2, deep_mlp=[16], cross_width=6,
                                                     cross_vocab=50))
    extra = 3 * 6  # ad_id, ad_category, the surface
    assert model.cross[0].dim == plain.cross[0].dim + extra
    assert model.head.in_dim == plain.head.in_dim + extra
    batch = random_batch(schema, 5)
    out = model(batch)
    masked_bce(out.logits, batch.labels, batch.label_mask).backward()
    for name, table in model.cross_attributes.tables.items():
        assert table.weight.grad is not None and torch.count_nonzero(table.weight.grad) > 0, name
    analytic, measured = model.flops_per_example(), measured_flops(model, batch)
    assert abs(analytic - measured) / measured < 0.10
    assert analytic > plain.flops_per_example()


def test_gem_ignores_cross_width_without_a_cross_branch_and_checks_it(schema):
    model = GEM(schema, EmbeddingConfig(d=8), HeadConfig(), _gem(cross_width=6))
    assert model.cross_attributes is None and len(model.cross) == 0
    with pytest.raises(ConfigError, match="gem.cross_width"):
        GEM(schema, EmbeddingConfig(d=8), HeadConfig(), _gem(cross_layers=1, cross_width=-1))
    with pytest.raises(ConfigError, match="gem.cross_vocab"):
        GEM(schema, EmbeddingConfig(d=8), HeadConfig(), _gem(cross_layers=1, cross_width=4, cross_vocab=0))
    with pytest.raises(ConfigError, match="dcnv2.cross_width"):
        DCNv2(schema, EmbeddingConfig(d=8), HeadConfig(), DCNv2Config(cross_width=-3))


@pytest.mark.parametrize("name,over", [("gem", ["model.gem.cross_layers=1", "model.gem.cross_width=4"]),
                                       ("dcnv2", ["model.dcnv2.cross_width=4"])])
def test_exported_model_with_cross_width_equals_eager(name, over):
    """The serving path reads the same ids: the plain-lookup module and torch.export match eager."""
    from opengem.data.sim_config import SimConfig, sim_schema
    from opengem.model.registry import build_model
    from opengem.serve.export import export_program, flat_inputs, serving_module
    from opengem.train.config import load_run_config

    tiny = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"
    sim = SimConfig.from_dict(tomllib.loads(tiny.read_text())["data"]["sim"])
    schema = sim_schema(sim)
    torch.manual_seed(0)
    model = build_model(schema, load_run_config(tiny, [f"model.name={name}", *over]).model).eval()
    assert model.cross_attributes is not None
    program = export_program(model, schema)
    for n in (1, 7):
        b = random_batch(schema, n, seed=n)
        with torch.no_grad():
            want = model(b).logits
            assert (serving_module(model)(*flat_inputs(b, schema)) - want).abs().max().item() <= 1e-5
            assert (program.module()(*flat_inputs(b, schema)) - want).abs().max().item() <= 1e-5
