"""History-vs-item counts (opengem.data.match_features): the vectorised values against a plain loop on random
jagged inputs (empty rows, id 0, windows longer and shorter than the rows), the schema's declaration and its
refusals, and the loader's batches carrying them for every model family."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from opengem.data.match_features import MatchFeature, first_values, match_feature_values
from opengem.data.random_batch import random_batch
from opengem.data.schema import FeatureSchema, SchemaError
from opengem.model.registry import ModelConfig, build_model

ROOT = Path(__file__).resolve().parents[1]


def reference(lengths, values, target, recent):
    out, at = [], 0
    for n, t in zip(lengths, target):
        row = list(values[at:at + n])
        at += n
        hits = [v == t and v != 0 for v in row]
        latest = hits[-recent:] if recent < len(hits) else hits
        out.append([math.log1p(sum(hits)), sum(latest) / max(min(n, recent), 1)])
    return np.array(out, dtype=np.float32).reshape(len(lengths), 2)


@pytest.mark.parametrize("seed", range(6))
def test_values_equal_a_plain_loop_on_random_jagged_histories(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    lengths = rng.integers(0, 12, n)
    lengths[rng.random(n) < 0.2] = 0  # empty histories
    values = rng.integers(0, 5, int(lengths.sum()))  # small vocabulary: many matches, some id 0
    target = rng.integers(0, 5, n)
    for recent in (1, 3, 8, 50):
        got = match_feature_values(lengths, values, target, recent)
        np.testing.assert_allclose(got, reference(lengths, values, target, recent), rtol=1e-6)
    assert got[lengths == 0].sum() == 0


def test_first_values_and_id_zero_never_matches():
    assert first_values(np.array([1, 0, 2]), np.array([7, 4, 5])).tolist() == [7, 0, 4]
    got = match_feature_values(np.array([3]), np.array([0, 0, 0]), np.array([0]), 8)
    assert got.tolist() == [[0.0, 0.0]]


def _schema_dict() -> dict:
    return {
        "name": "m", "surfaces": ["a"], "task": [{"name": "click"}],
        "sparse": [{"name": "ad", "vocab": 9, "dim": 4, "table": "item"},
                   {"name": "tags", "vocab": 9, "dim": 4, "table": "item", "multi_valued": True},
                   {"name": "user", "vocab": 9, "dim": 4}],
        "sequence": [{"name": "hist", "max_len": 6, "fields": [{"name": "item", "vocab": 9, "dim": 4,
                                                                 "table": "item"}]}],
        "match_features": [{"sequence": "hist", "field": "item", "feature": "ad", "recent": 3}],
    }


def test_schema_declares_round_trips_and_sizes_the_dense_input():
    s = FeatureSchema.from_dict(_schema_dict(), source="t")
    assert s.match_features == (MatchFeature("hist", "item", "ad", 3),)
    assert s.dense_input_names == ["match_hist_item_count", "match_hist_item_recent3"]
    assert s.num_dense_inputs == 2
    assert FeatureSchema.from_dict(s.to_dict(), source="t2") == s
    plain = {k: v for k, v in _schema_dict().items() if k != "match_features"}
    assert "match_features" not in FeatureSchema.from_dict(plain, source="t").to_dict()  # only when set


@pytest.mark.parametrize("change,where", [
    ({"sequence": "nope"}, "no sequence group 'nope'"),
    ({"field": "nope"}, "'nope' is not an id field of 'hist'"),
    ({"feature": "tags"}, "'tags' is not a single-valued sparse feature"),
    ({"feature": "user"}, "do not share a table"),
    ({"recent": 0}, "recent: must be > 0"),
])
def test_declarations_that_cannot_count_are_refused(change, where):
    d = _schema_dict()
    d["match_features"] = [{**d["match_features"][0], **change}]
    with pytest.raises(SchemaError, match=where):
        FeatureSchema.from_dict(d, source="t")


@pytest.mark.parametrize("family", ["gem", "dlrm", "dcnv2", "din", "wukong", "lr"])
def test_every_family_reads_the_counts(family):
    """A random batch carries the counts as to_batch derives them; every family is sized by them and runs."""
    s = FeatureSchema.from_dict(_schema_dict(), source="t")
    b = random_batch(s, 16, seed=3)
    kjt = b.sparse.to_dict()
    want = match_feature_values(b.sequences["hist"].lengths.numpy(), b.sequences["hist"].ids["item"].numpy(),
                                first_values(kjt["ad"].lengths().numpy(), kjt["ad"].values().numpy()), 3)
    assert torch.equal(b.dense, torch.from_numpy(want))
    torch.manual_seed(0)
    model = build_model(s, ModelConfig(name=family))
    assert model(b).logits.shape == (16, 1)
