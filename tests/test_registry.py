from pathlib import Path

import pytest
import torch

from opengem.config import ConfigError, load_config
from opengem.data.random_batch import random_batch
from opengem.data.schema import FeatureSchema
from opengem.model.baselines import DIN, DLRM, DCNv2
from opengem.model.output import ModelOutput
from opengem.model.registry import MODEL_NAMES, ModelConfig, build_model

TINY = Path(__file__).resolve().parents[1] / "configs" / "schemas" / "tiny.toml"


@pytest.fixture(scope="module")
def schema() -> FeatureSchema:
    return FeatureSchema.load(TINY)


@pytest.mark.parametrize("name,cls", [("dlrm", DLRM), ("dcnv2", DCNv2), ("din", DIN)])
def test_build_baselines(schema, name, cls):
    m = build_model(schema, ModelConfig(name=name))
    assert type(m) is cls
    out = m(random_batch(schema, 3))
    assert isinstance(out, ModelOutput) and out.logits.shape == (3, 2)
    assert m.flops_per_example() > 0


def test_unknown_name_fails_clearly(schema):
    with pytest.raises(ValueError, match="unknown model 'dlmr'"):
        build_model(schema, ModelConfig(name="dlmr"))


def test_model_config_from_toml_and_overrides(tmp_path):
    p = tmp_path / "m.toml"
    p.write_text('name = "dcnv2"\n[embedding]\nd = 8\n[dcnv2]\nlow_rank = 4\n')
    cfg = load_config(ModelConfig, p, ["head.hidden=[16]", "dcnv2.structure=stacked"])
    assert cfg.name == "dcnv2" and cfg.embedding.d == 8 and cfg.dcnv2.low_rank == 4
    assert cfg.head.hidden == [16] and cfg.dcnv2.structure == "stacked"
    with pytest.raises(ConfigError, match="unknown key 'lowrank'"):
        load_config(ModelConfig, None, ["dcnv2.lowrank=4"])
    with pytest.raises(ValueError, match="structure"):
        build_model(
            FeatureSchema.load(TINY), load_config(ModelConfig, None, ["name=dcnv2", "dcnv2.structure=x"])
        )


def test_every_name_is_buildable(schema):
    for name in MODEL_NAMES:
        assert callable(build_model(schema, ModelConfig(name=name)).flops_per_example)


@pytest.mark.parametrize("name", ["gem", "wukong"])
def test_gem_and_wukong_through_registry(schema, name):
    torch.manual_seed(0)
    m = build_model(schema, ModelConfig(name=name))
    b = random_batch(schema, 4)
    out = m(b)
    assert out.logits.shape == (4, 2) and out.trunk.dim() == 2
    out.logits.sum().backward()
    assert m.embedding.ecs["d8"].embeddings["item"].weight.grad is not None
    if name == "wukong":
        assert m.cfg.use_sequences is False and m.cfg.wukong.cross_layer_attention is False
    assert m.flops_per_example() > 0
