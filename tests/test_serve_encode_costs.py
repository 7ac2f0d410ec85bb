"""The fixed-cost cuts of request encoding change no result: the loader's Columns without nulls, with
some and with only nulls; repairs counted in full while rows are found only for the samples a log keeps;
the shared bookkeeping columns of a request; the cheaper unknown-feature check still naming the key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from opengem.data.dataset import arrow_schema
from opengem.data.parquet import Columns, ProblemLog, check_columns, conform_table, to_batch
from opengem.data.schema import FeatureSchema
from opengem.serve.encode import RequestEncoder
from opengem.serve.errors import BadRequest
from serve_helpers import hashed_tiny_schema

TINY = Path(__file__).resolve().parents[1] / "configs" / "schemas" / "tiny.toml"


@pytest.fixture(scope="module")
def schema() -> FeatureSchema:
    return hashed_tiny_schema()


def _table(schema: FeatureSchema, n: int, **columns: list) -> pa.Table:
    base = {"example_id": list(range(n)), "ts": [5] * n, "surface": [i % 3 for i in range(n)],
            "user_id": [7] * n, "ad_id": [3] * n, "ad_category": [1] * n, "user_interests": [[1, 2]] * n,
            "ad_quality": [0.5] * n, "user_activity": [-1.0] * n, "hist__item": [[4, 5]] * n,
            "hist__action": [[0, 1]] * n, "hist__dt": [[0.1, 0.2]] * n, "click": [1.0] * n,
            "conversion": [0.0] * n}
    base.update(columns)
    return pa.table({f.name: pa.array(base[f.name], type=f.type) for f in arrow_schema(schema)})


def test_columns_with_no_some_and_only_nulls(schema) -> None:  # type: ignore[no-untyped-def]
    t = _table(schema, 4, ad_id=[3, None, 9, None], ad_quality=[0.5, None, 0.25, 1.0],
               conversion=[None] * 4, user_interests=[[1], None, [], [2, 3]],
               hist__dt=[[0.1, None], [], [0.3], [0.4]])
    c = Columns.from_arrow(t, schema)
    assert c.masks["example_id"].tolist() == [True] * 4 and c.masks["example_id"].dtype == bool
    assert c.scalars["surface"].dtype == np.int64 and c.scalars["surface"].tolist() == [0, 1, 2, 0]
    assert c.lists["ad_id"][0].tolist() == [1, 0, 1, 0] and c.lists["ad_id"][1].tolist() == [3, 9]
    assert c.lists["user_id"][0].tolist() == [1] * 4 and c.lists["user_id"][0].dtype == np.int64
    assert np.isnan(c.scalars["ad_quality"][1]) and c.scalars["ad_quality"].dtype == np.float32
    assert c.masks["conversion"].tolist() == [False] * 4 and c.scalars["conversion"].tolist() == [0.0] * 4
    assert c.scalars["conversion"].dtype == np.float32 and c.masks["click"].tolist() == [True] * 4
    assert c.lists["user_interests"][0].tolist() == [1, 0, 0, 2]
    assert c.lists["user_interests"][1].tolist() == [1, 2, 3]
    dt = c.lists["hist__dt"][1]
    assert dt.dtype == np.float32 and np.isnan(dt[1]) and c.lists["hist__dt"][0].tolist() == [2, 0, 1, 1]
    empty = Columns.from_arrow(t.slice(0, 0), schema)
    assert empty.n == 0 and empty.scalars["conversion"].shape == (0,)


def test_repairs_count_every_id_and_sample_only_what_the_log_keeps(schema) -> None:  # type: ignore[no-untyped-def]
    ids = [3, 60, 70, 4, 80, 5]  # vocab 50: rows 1, 2, 4 are hashed
    cols = Columns.from_arrow(_table(schema, 6, ad_id=ids), schema, first_row=100)
    logs = {keep: ProblemLog(keep=keep) for keep in (0, 2, 100)}
    out = {keep: check_columns(cols, schema, "f", log) for keep, log in logs.items()}
    for keep, log in logs.items():
        assert log.counts == {("f", "ad_id", "id beyond vocabulary 50"): 3}
        assert out[keep].lists["ad_id"][1].tolist() == [3, 10, 20, 4, 30, 5]  # ids mod 50
    assert logs[0].samples == []
    assert [(p.row, p.what) for p in logs[2].samples] == [(101, "id beyond vocabulary 50 (value 60)"),
                                                          (102, "id beyond vocabulary 50 (value 70)")]
    assert [p.row for p in logs[100].samples] == [101, 102, 104]
    assert logs[100].room == 97 and logs[0].room == 0


def test_a_table_already_canonical_conforms_without_casts(schema) -> None:  # type: ignore[no-untyped-def]
    t = _table(schema, 3)
    out = conform_table(t, schema, "f")
    assert out.schema.equals(arrow_schema(schema))
    assert all(out.column(i).equals(t.column(i)) for i in range(t.num_columns))
    wide = t.set_column(t.schema.get_field_index("ad_id"), "ad_id", pa.array([1, 2, 3], pa.int32()))
    assert conform_table(wide, schema, "f").column("ad_id").type == pa.int64()  # still cast when needed


def _request(n: int, surface: str) -> dict:
    cands = [{"ad_id": 3 + i, "ad_category": 1, "ad_quality": 0.5} for i in range(n)]
    context = {"user_id": 7, "user_interests": [1, 2], "user_activity": -1.0, "hist__item": [4],
               "hist__action": [0], "hist__dt": [0.1]}
    return {"surface": surface, "context": context, "candidates": cands}


def test_requests_of_one_size_share_bookkeeping_but_keep_their_surface(schema) -> None:  # type: ignore[no-untyped-def]
    enc = RequestEncoder(schema)
    feed = to_batch(enc.columns_of(_request(4, "feed")), schema)
    stories, counts = enc.batch([_request(4, "stories"), _request(4, "feed")])
    assert feed.surface.tolist() == [0] * 4 and feed.example_id.tolist() == [0, 1, 2, 3]
    assert stories.surface.tolist() == [1] * 4 + [0] * 4 and counts == [4, 4]
    assert stories.label_mask.sum().item() == 0  # labels are not observed when serving


def test_an_unknown_key_in_place_of_a_wanted_one_is_named(schema) -> None:  # type: ignore[no-untyped-def]
    enc = RequestEncoder(schema)
    req = _request(3, "feed")
    req["candidates"][1] = {"ad_id": 4, "ad_category": 1, "ad_qualiti": 0.5}  # same number of keys
    with pytest.raises(BadRequest, match="candidate 1: unknown feature 'ad_qualiti'"):
        enc.batch([req])
    req["candidates"][1] = {"ad_id": 4, "ad_category": 1}
    with pytest.raises(BadRequest, match="candidate 1: missing feature 'ad_quality'"):
        enc.batch([req])


@pytest.mark.parametrize("max_len", [1, 3, 20])
def test_truncation_keeps_the_newest_events_of_every_field(max_len: int) -> None:
    """A group's truncation builds its mask once for fields sharing their lengths (a [rows, max_len]
    grid for a short max_len, a mask over the events for a long one); a field with other lengths gets
    its own. Either way each row keeps its last ``max_len`` events, as a per-row slice does."""
    from opengem.data.parquet import _truncate

    rng = np.random.default_rng(max_len)
    ln = rng.integers(0, 12, 200).astype(np.int64)
    other = rng.integers(0, 12, 200).astype(np.int64)
    values = {"a": (ln, rng.integers(0, 99, ln.sum())), "b": (ln.copy(), rng.random(ln.sum())),
              "c": (other, rng.integers(0, 99, other.sum()))}
    out = _truncate(values, max_len)
    for name, (lengths, v) in values.items():
        starts = np.concatenate([[0], np.cumsum(lengths)])
        newest = [v[starts[i]:starts[i + 1]][-max_len:] for i in range(len(lengths)) if lengths[i]]
        assert np.array_equal(out[name][0], np.minimum(lengths, max_len))
        assert np.array_equal(out[name][1], np.concatenate(newest))


def test_flat_inputs_split_the_sparse_features_as_to_dict_does() -> None:
    """The exported program's sparse inputs come from one view and one split of the Batch's KJT; they
    are to_dict's, empty rows and empty features included, and a KJT in another key order falls back."""
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from opengem.serve.export import _per_key

    keys, rows = ["a", "b", "c"], 5
    lengths = torch.tensor([0, 2, 1, 0, 3, 0, 0, 0, 0, 0, 1, 1, 4, 0, 2])
    kjt = KeyedJaggedTensor(keys=keys, values=torch.arange(int(lengths.sum())), lengths=lengths)
    for order in (keys, ["c", "a", "b"]):
        split = _per_key(kjt, order, rows)
        reference = kjt.to_dict()
        assert list(split) == order
        for k in order:
            assert torch.equal(split[k][0], reference[k].values())
            assert torch.equal(split[k][1], reference[k].lengths())


def test_flat_tensors_are_pytrees_leaves_of_flat_inputs(schema) -> None:  # type: ignore[no-untyped-def]
    """The AOTI package is called with this list instead of its pytree-flattening ``__call__``: it must be
    the same tensors in the same order (sparse features, then sequence lengths, id fields, dense fields)."""
    import torch
    import torch.utils._pytree as pytree

    from opengem.serve.export import flat_inputs, flat_tensors

    t = _table(schema, 4, user_interests=[[1], [], [2, 3], [4]], hist__item=[[4, 5], [], [6], [7, 8]],
               hist__action=[[0, 1], [], [1], [0, 0]], hist__dt=[[0.1, 0.2], [], [0.3], [0.4, 0.5]])
    b = to_batch(Columns.from_arrow(t, schema), schema)
    got, want = flat_tensors(b, schema), pytree.tree_leaves(flat_inputs(b, schema))
    n_seq = sum(1 + len(g.fields) for g in schema.sequences)
    assert len(got) == len(want) == 2 + 2 * len(schema.sparse) + n_seq and n_seq
    for a, w in zip(got, want, strict=True):  # (each call makes new views: compare what they hold)
        assert a.dtype == w.dtype and torch.equal(a, w)
