import dataclasses
from pathlib import Path

import pytest
import torch

from opengem.data.random_batch import random_batch
from opengem.data.schema import FeatureSchema
from opengem.data.sim_config import SimConfig, sim_schema
from opengem.model.embedding import EmbeddingConfig, FeatureEmbedding

TINY = Path(__file__).resolve().parents[1] / "configs" / "schemas" / "tiny.toml"


@pytest.fixture(scope="module")
def schema() -> FeatureSchema:
    return FeatureSchema.load(TINY)


def _tables(m: FeatureEmbedding) -> dict[str, torch.nn.Parameter]:
    out = dict(m.ebc.embedding_bags.items()) if m.ebc is not None else {}
    for ec in m.ecs.values():
        out.update(ec.embeddings.items())
    return {k: v.weight for k, v in out.items()}


def test_shapes_and_masks(schema):
    torch.manual_seed(0)
    m = FeatureEmbedding(schema, EmbeddingConfig(d=32))
    b = random_batch(schema, 6, max_seq_len=7)
    e = m(b)
    # tiny: ad_id (target, own token), {user_id, ad_category, user_interests} grouped (8+4+4=16 -> 32),
    # 1 dense token, 1 surface token
    assert m.num_tokens == 4
    assert e.tokens.shape == (6, 4, 32)
    assert e.target.shape == (6, 32)
    s = e.sequences["hist"]
    lens = b.sequences["hist"].lengths
    assert s.values.shape == (6, int(lens.max()), 32)
    assert torch.equal(s.mask, torch.arange(s.values.shape[1])[None] < lens[:, None])
    assert torch.equal(s.lengths, lens)
    assert (s.values[~s.mask] == 0).all()
    assert {k: tuple(v.shape) for k, v in e.pooled.items()} == {
        "user_id": (6, 8),
        "ad_id": (6, 8),
        "ad_category": (6, 4),
        "user_interests": (6, 4),
    }


def test_pad_to_max_len_and_ungrouped(schema):
    m = FeatureEmbedding(
        schema, EmbeddingConfig(d=32, group_small=False, pad_to_max_len=True, dense_tokens=2)
    )
    e = m(random_batch(schema, 3, max_seq_len=4))
    assert e.sequences["hist"].values.shape == (3, 12, 32)
    assert m.num_tokens == 4 + 2 + 1
    assert e.tokens.shape == (3, 7, 32)


def test_shared_table_is_one_parameter(schema):
    torch.manual_seed(0)
    m = FeatureEmbedding(schema, EmbeddingConfig(d=8))
    tables = _tables(m)
    assert set(tables) == {"user_id", "ad_category", "item", "action"}
    item = tables["item"]
    # no second copy of the item table anywhere in the module
    assert sum(1 for p in m.parameters() if p.shape == item.shape and p is not item) == 0
    b = random_batch(schema, 5)
    e = m(b)
    ad_ids = b.sparse["ad_id"].values()
    assert torch.allclose(e.pooled["ad_id"], item[ad_ids])
    # the target (ranked ad) and the history both train the same tensor
    e.target.sum().backward()
    assert item.grad is not None and item.grad[ad_ids].abs().sum() > 0
    m.zero_grad()
    e = m(b)
    e.sequences["hist"].values.sum().backward()
    hist_ids = b.sequences["hist"].ids["item"]
    assert item.grad[hist_ids].abs().sum() > 0
    untouched = torch.ones(item.shape[0], dtype=torch.bool)
    untouched[hist_ids] = False
    assert (item.grad[untouched] == 0).all()


def test_mean_pooling_per_feature_on_shared_sum_table(schema):
    m = FeatureEmbedding(schema, EmbeddingConfig(d=8))
    b = random_batch(schema, 7)
    e = m(b)
    w = _tables(m)["ad_category"]
    jt = b.sparse["user_interests"]
    off = jt.offsets()
    ref = torch.stack([w[jt.values()[off[i] : off[i + 1]]].mean(0) for i in range(7)])
    assert torch.allclose(e.pooled["user_interests"], ref, atol=1e-6)
    cat = b.sparse["ad_category"].values()
    assert torch.allclose(e.pooled["ad_category"], w[cat])


def test_gradients_reach_every_parameter(schema):
    m = FeatureEmbedding(schema, EmbeddingConfig(d=16))
    b = random_batch(schema, 8)
    b.surface = torch.arange(8) % 3
    e = m(b)
    (e.tokens.sum() + e.sequences["hist"].values.sum() + e.target.sum()).backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_jagged_to_padded_matches_per_row_reference(schema):
    torch.manual_seed(1)
    m = FeatureEmbedding(schema, EmbeddingConfig(d=16))
    b = random_batch(schema, 5, seed=3)
    seq = m(b).sequences["hist"]
    sb = b.sequences["hist"]
    t = _tables(m)
    proj = m.seq_proj["hist"]
    off = sb.offsets
    L = seq.values.shape[1]
    for r in range(5):
        rows = []
        for j in range(int(off[r]), int(off[r + 1])):
            x = torch.cat(
                [t["item"][sb.ids["item"][j]], t["action"][sb.ids["action"][j]], sb.dense["dt"][j : j + 1]]
            )
            rows.append(proj(x))
        ref = torch.zeros(L, 16)
        if rows:
            ref[: len(rows)] = torch.stack(rows)
        assert torch.allclose(seq.values[r], ref, atol=1e-5), r


def test_target_defaults_and_no_sequence_schema():
    schema = FeatureSchema.from_dict(
        {
            "name": "flat",
            "surfaces": ["a"],
            "task": [{"name": "click"}],
            "sparse": [{"name": "u", "vocab": 10, "dim": 4}, {"name": "v", "vocab": 10, "dim": 16}],
        }
    )
    m = FeatureEmbedding(schema, EmbeddingConfig(d=16))
    assert m.ecs is not None and len(m.ecs) == 0 and m.target_features == []
    e = m(random_batch(schema, 3))
    assert e.sequences == {}
    assert torch.allclose(e.target, e.tokens.mean(1))
    m2 = FeatureEmbedding(schema, EmbeddingConfig(d=16, target_features=["v"]))
    e2 = m2(random_batch(schema, 3))
    assert torch.allclose(e2.target, e2.pooled["v"])  # dim == d: passes through unprojected


def test_bad_input_raises_clear_errors(schema):
    with pytest.raises(ValueError, match="target_features"):
        FeatureEmbedding(schema, EmbeddingConfig(target_features=["nope"]))
    m = FeatureEmbedding(schema, EmbeddingConfig(d=8))
    b = random_batch(schema, 4)
    b.dense = b.dense[:, :1]
    with pytest.raises(ValueError, match="dense"):
        m(b)


def test_init_scale_sets_table_range_and_auto_target_skips_multi_valued():
    schema = sim_schema(SimConfig(users=5000, ads=400, topics=20, seq_max=8, seq_mean=4.0))
    default = _tables(FeatureEmbedding(schema, EmbeddingConfig(d=16)))
    scaled = _tables(FeatureEmbedding(schema, EmbeddingConfig(d=16, init_scale=1.0)))
    r = 1.0 / 16**0.5
    for name, w in scaled.items():
        assert w.abs().max() <= r + 1e-6, name
        assert w.std() > 0.5 * r / 3**0.5, name  # U(-r, r) has std r / sqrt(3), whatever the vocabulary
    assert default["user_id"].abs().max() <= (1 / 5000) ** 0.5 + 1e-6  # TorchRec's default shrinks with rows
    # the user's interest categories share the category table with the history but are not the ranked ad
    assert FeatureEmbedding(schema, EmbeddingConfig(d=16)).target_features == ["ad_id", "ad_category"]


def test_dense_norm_standardises_dense_inputs(schema):
    torch.manual_seed(0)
    b = random_batch(schema, 64, max_seq_len=7)
    b.dense = b.dense * 50.0 + 10.0  # arbitrary units
    m = FeatureEmbedding(schema, EmbeddingConfig(d=16, dense_norm=True)).train()
    e = m(b)
    assert torch.allclose(e.dense.mean(0), torch.zeros(e.dense.shape[1]), atol=1e-3)
    assert torch.allclose(e.dense.std(0, unbiased=False), torch.ones(e.dense.shape[1]), atol=2e-2)
    m.eval()
    assert torch.allclose(m(b).dense, e.dense)  # evaluation normalises exactly as training did
    raw = FeatureEmbedding(schema, EmbeddingConfig(d=16))(b)
    assert torch.equal(raw.dense, b.dense)


def test_seq_recent_reads_only_the_most_recent_events(schema):
    """``seq_recent = k`` is the same model fed each history's last k events, on the jagged path and on
    the static (pad_to_max_len) one, and counts k events per example in its FLOPs."""
    torch.manual_seed(0)
    b = random_batch(schema, 6, max_seq_len=9)
    k = 3
    full = FeatureEmbedding(schema, EmbeddingConfig(d=16))
    cut_cfgs = [EmbeddingConfig(d=16, seq_recent=k), EmbeddingConfig(d=16, seq_recent=k, pad_to_max_len=True)]
    sb = b.sequences["hist"]
    lens = sb.lengths
    assert int(lens.max()) > k and int(lens.min()) < k  # rows cut and rows kept whole
    short = dataclasses.replace(b, sequences={"hist": sb.recent(k)})
    ref = full(short).sequences["hist"]
    for cfg in cut_cfgs:
        m = FeatureEmbedding(schema, cfg)
        m.load_state_dict(full.state_dict())
        s = m(b).sequences["hist"]
        assert torch.equal(s.lengths, lens.clamp(max=k))
        assert s.values.shape[1] == k
        assert torch.allclose(s.values, ref.values[:, :k], atol=1e-6) and torch.equal(s.mask, ref.mask[:, :k])
        assert m.seq_len("hist") == k
        assert full.flops_per_example() - m.flops_per_example() == (
            (full.seq_len("hist") - k) * 2 * m.seq_proj["hist"].in_features * 16)
    # recent(k) of a row kept whole is the row itself
    assert sb.recent(int(lens.max())) is sb
