"""model.name = "lr": logistic regression in the same harness as every model (issue 11 acceptance).

It is the floor the deep models must clear, so these tests pin that it *is* logistic regression: the
logit is a per-(surface, task) bias plus one effective weight per id plus a linear term per dense value
(no interaction between features), it builds from the test recipes, and it trains through the one
Trainer (fused row-wise Adagrad on its tables, output bias at the base rate).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from opengem.cli import main
from opengem.data.batch import Batch, SequenceBatch
from opengem.data.dataset import Dataset
from opengem.data.random_batch import random_batch
from opengem.data.schema import FeatureSchema
from opengem.model.baselines import LR, LR_DIM, LRConfig
from opengem.model.embedding import EmbeddingConfig
from opengem.model.flops import measured_flops
from opengem.model.heads import HeadConfig, MultiSurfaceHead
from opengem.model.registry import build_model
from opengem.train.config import load_run_config
from opengem.train.data import make_loader, prepare_data
from opengem.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
TINY_SCHEMA = ROOT / "configs" / "schemas" / "tiny.toml"
TINY = ROOT / "configs" / "tiny.toml"


@pytest.fixture(scope="module")
def schema() -> FeatureSchema:
    return FeatureSchema.load(TINY_SCHEMA)


@pytest.fixture(scope="module")
def model(schema) -> LR:
    cfg = load_run_config(TINY, ["model.name=lr"])
    torch.manual_seed(0)
    m = build_model(schema, cfg.model)
    assert isinstance(m, LR)
    m.eval()
    return m


def _with_ids(batch: Batch, feature: str, ids: torch.Tensor) -> Batch:
    """``batch`` with single-valued ``feature`` set to ``ids`` [B]."""
    d = batch.sparse.to_dict()
    keys = list(d)
    values = [ids if k == feature else d[k].values() for k in keys]
    lengths = [torch.ones_like(ids) if k == feature else d[k].lengths() for k in keys]
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.cat(values), lengths=torch.cat(lengths))
    return dataclasses.replace(batch, sparse=kjt)


def _batch(schema: FeatureSchema, n: int = 6) -> Batch:
    b = random_batch(schema, n, seed=3)
    b.surface = torch.arange(n) % len(schema.surfaces)
    return b


def test_builds_from_the_tiny_recipe_with_per_surface_task_logits(schema, model):
    b = _batch(schema)
    out = model(b)
    assert out.logits.shape == (6, len(schema.tasks))
    heads = [m for m in model.modules() if isinstance(m, MultiSurfaceHead)]
    assert len(heads) == 1 and heads[0].out_bias.shape == (len(schema.surfaces), len(schema.tasks))
    # no trunk, no adapter: the head is one linear map per (surface, task); the tables are LR_DIM wide
    assert heads[0].cfg.hidden == [] and heads[0].cfg.adapter_dim == 0
    assert {cfg.embedding_dim for cfg in model.embedding.ebc.embedding_bag_configs()} == {LR_DIM}
    # analytic FLOPs (histories at max_len) match what FlopCounterMode measures on the module
    full = random_batch(schema, 4, seed=1)
    for g in schema.sequences:
        n = 4 * g.max_len
        full.sequences[g.name] = SequenceBatch(
            lengths=torch.full((4,), g.max_len),
            ids={f.name: torch.randint(0, f.vocab, (n,)) for f in g.id_fields},
            dense={f.name: torch.randn(n) for f in g.dense_fields})
    assert model.flops_per_example() == pytest.approx(measured_flops(model, full), rel=0.10)
    assert model.schema is schema  # callers see the user's schema, not the 4-wide copy


def test_an_ids_contribution_is_its_weight_and_features_add_up(schema, model):
    b = _batch(schema)
    S = b.surface
    rows = model.embedding.ebc.embedding_bags["user_id"].weight.detach()
    a = model.head.out_weight.detach()[S][:, :LR_DIM, :]  # user_id is the first token: inputs 0..LR_DIM-1

    def logits(user: int, cat: int, batch: Batch = b) -> torch.Tensor:
        x = _with_ids(batch, "user_id", torch.full((6,), user))
        x = _with_ids(x, "ad_category", torch.full((6,), cat))
        with torch.no_grad():
            return model(x).logits

    # moving every row from user 7 to user 42 changes the logit by exactly the weight difference, weighed
    # by the head (at the start a = 1/LR_DIM: the id's weight is the mean of its row)
    diff = logits(42, 1) - logits(7, 1)
    want = torch.einsum("c,bct->bt", rows[42] - rows[7], a)
    torch.testing.assert_close(diff, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(diff, (rows[42] - rows[7]).mean().expand_as(diff), rtol=1e-5, atol=1e-6)
    # no interaction: the change of one feature does not depend on the value of another
    torch.testing.assert_close(logits(42, 9) - logits(7, 9), diff, rtol=1e-5, atol=1e-6)


def test_dense_values_enter_linearly(schema):
    cfg = load_run_config(TINY, ["model.name=lr"])
    torch.manual_seed(1)
    m = build_model(schema, cfg.model).eval()
    with torch.no_grad():
        m.head.out_weight.normal_()  # dense weights start at 0: give them values to see
    b = _batch(schema)
    k = 1  # user_activity
    moved = dataclasses.replace(b, dense=b.dense + 2.5 * torch.nn.functional.one_hot(torch.tensor(k), 2))
    with torch.no_grad():
        diff = m(moved).logits - m(b).logits
    want = 2.5 * m.head.out_weight.detach()[b.surface][:, m.num_id_inputs + k, :]
    torch.testing.assert_close(diff, want, rtol=1e-5, atol=1e-5)


def test_without_sequences_histories_are_ignored(schema):
    m = LR(schema, EmbeddingConfig(), HeadConfig(), LRConfig(use_sequences=False)).eval()
    b = _batch(schema)
    empty = {g: dataclasses.replace(s, lengths=torch.zeros_like(s.lengths),
                                    ids={k: v[:0] for k, v in s.ids.items()},
                                    dense={k: v[:0] for k, v in s.dense.items()})
             for g, s in b.sequences.items()}
    with torch.no_grad():
        torch.testing.assert_close(m(b).logits, m(dataclasses.replace(b, sequences=empty)).logits)
    assert not m.embedding.ecs  # no table a sequence would use


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    cfg = load_run_config(TINY, ["train.progress=false"])
    return prepare_data(cfg.data, tmp_path_factory.mktemp("lr"))


def test_trainer_starts_bias_at_base_rate_and_fits_a_batch(data):
    cfg = load_run_config(TINY, ["model.name=lr", "train.progress=false", "train.warmup_steps=0",
                                 "train.sparse_lr=0.3"])
    batch = next(iter(make_loader(Dataset(data), "@train", cfg.data, train=True)))
    with Trainer(cfg, None, data) as tr:
        (head,) = [m for m in tr.model.modules() if isinstance(m, MultiSurfaceHead)]
        for s, row in enumerate(tr.base_rates):
            for t, rate in enumerate(row):
                if rate is not None:
                    assert float(head.out_bias[s, t]) == pytest.approx(math.log(rate / (1 - rate)), abs=1e-5)
        losses = [tr.train_step(batch) for _ in range(25)]
    # the same batch again and again: the id weights (fused optimizer) memorise it
    assert losses[-1] < 0.7 * losses[0], losses


def test_opengem_train_model_lr_trains(tmp_path, capsys):
    out = tmp_path / "run"
    # bias not started at the base rate: the first steps have far to go, so the fall is unmistakable
    rc = main(["train", "--config", str(TINY), "--out", str(out), "model.name=lr", "train.progress=false",
               "train.init_output_bias=false"])
    assert rc in (0, None)
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in recs if r.get("kind") == "train"]
    assert len(losses) >= 3 and losses[-1] < 0.6 * losses[0], losses
    saved = (out / "config.toml").read_text()
    assert 'name = "lr"' in saved and "[model.lr]" in saved


def test_builds_on_a_dense_only_schema():
    """No sparse feature: the surface token is the only id input, and the dense values still enter."""
    s = FeatureSchema.from_dict({"name": "d", "surfaces": ["a", "b"], "dense": [{"name": "x"}, {"name": "y"}],
                                 "task": [{"name": "click"}]})
    m = build_model(s, load_run_config(TINY, ["model.name=lr"]).model)
    b = _batch(s, 4)
    assert m(b).logits.shape == (4, 1) and m.num_id_inputs == LR_DIM and m.num_dense == 2
