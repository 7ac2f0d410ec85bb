"""The fixed-cost cuts of request encoding change no result: the loader's Columns without nulls, with
some and with only nulls; repairs counted in full while rows are found only for the samples a log keeps;
the shared bookkeeping columns of a request; the cheaper unknown-feature check still naming the key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from opengem.data.dataset import arrow_schema
from opengem.data.parquet import Columns, ProblemLog, check_columns, conform_table, to_batch
from opengem.data.schema import FeatureSchema
from opengem.serve.encode import RequestEncoder
from opengem.serve.errors import BadRequest

TINY = Path(__file__).resolve().parents[1] / "configs" / "schemas" / "tiny.toml"


@pytest.fixture(scope="module")
def schema() -> FeatureSchema:
    """tiny.toml with ad_id's out-of-vocabulary ids hashed (a repair, as a VM schema declares)."""
    s = FeatureSchema.load(TINY)
    sparse = tuple(dataclasses.replace(f, on_oov="hash") if f.name == "ad_id" else f for f in s.sparse)
    return dataclasses.replace(s, sparse=sparse)


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
