"""The cheaper encode path of issue 16 (session 5) changes no result and weakens no check: list columns
read from their offsets equal ``list_value_length``/``flatten`` (slices, null elements, null lists); the
conform plan cached for the last schema still names a wrong, missing, extra or repeated column; the
min/max test of ids still counts every repair and names the row of a refused id; the merged Arrow
table's cached layout follows a client that changes its schema and still refuses a bad body."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from opengem.data import parquet
from opengem.data.dataset import arrow_schema
from opengem.data.parquet import Columns, DataError, ProblemLog, check_columns, conform_table
from opengem.data.schema import FeatureSchema
from opengem.serve.encode import RequestEncoder
from opengem.serve.errors import BadRequest
from serve_helpers import hashed_tiny_schema

TINY = Path(__file__).resolve().parents[1] / "configs" / "schemas" / "tiny.toml"


@pytest.fixture(scope="module")
def schema() -> FeatureSchema:
    return hashed_tiny_schema()


def _candidates(n: int, **columns: list) -> dict[str, list]:
    base = {"user_id": [7] * n, "ad_id": [3 + i for i in range(n)], "ad_category": [1] * n,
            "user_interests": [[1, 2]] * n, "ad_quality": [0.5] * n, "user_activity": [-1.0] * n,
            "hist__item": [[4, 5]] * n, "hist__action": [[0, 1]] * n, "hist__dt": [[0.1, 0.2]] * n}
    base.update(columns)
    return base


def _slow_list_np(a: pa.Array, fill: float, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    lengths = pc.list_value_length(a).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    return lengths, a.flatten().fill_null(fill).to_numpy(zero_copy_only=False).astype(dtype)


@pytest.mark.parametrize("values", [[[1, 2], [], [3], [4, 5, 6]], [[1, None], [], [None]],
                                    [[1], None, [2, 3]], [], [[]]])
def test_list_columns_from_offsets_equal_the_kernels(values: list) -> None:
    a = pa.array(values, type=pa.list_(pa.int64()))
    for part in (a, a.slice(1), a.slice(1, max(0, len(a) - 2)), a.slice(len(a))):
        got, want = parquet._list_np(part, -1, np.int64), _slow_list_np(part, -1, np.int64)
        assert got[0].dtype == want[0].dtype == np.int64 and got[1].dtype == want[1].dtype == np.int64
        assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
    f = pa.array([[0.5, None], [1.5]], type=pa.list_(pa.float32())).slice(1)
    assert parquet._list_np(f, np.nan, np.float32)[1].tolist() == [1.5]


def test_cached_conform_plan_still_names_each_bad_column(schema) -> None:  # type: ignore[no-untyped-def]
    target = arrow_schema(schema)
    good = pa.Table.from_arrays([pa.nulls(2, f.type) if f.nullable else pa.array([0, 1], type=f.type)
                                 for f in target], schema=target)
    doubles = good.set_column(good.schema.get_field_index("ad_quality"), "ad_quality",
                              pa.array([0.5, 1.5], type=pa.float64()))
    for _ in range(2):  # the second call takes the cached plan
        out = conform_table(doubles, schema, "f.parquet", target=target)
        assert out.schema.equals(target) and out.column("ad_quality").to_pylist() == [0.5, 1.5]
        assert conform_table(good, schema, "f.parquet", target=target) is good
    # a wrong type after a good schema was cached, in column order as before the cache
    wrong = doubles.set_column(doubles.schema.get_field_index("user_id"), "user_id", pa.array(["a", "b"]))
    wrong = wrong.set_column(wrong.schema.get_field_index("ad_id"), "ad_id", pa.array(["c", "d"]))
    for _ in range(2):
        with pytest.raises(DataError, match="wrong type string") as e:
            conform_table(wrong, schema, "f.parquet", target=target)
        assert e.value.column == "user_id"
    with pytest.raises(DataError, match="missing column") as e:
        conform_table(good.drop_columns(["ad_id"]), schema, "f.parquet", target=target)
    assert e.value.column == "ad_id"
    with pytest.raises(DataError, match="column not in schema"):
        conform_table(good.append_column("zz", pa.array([1, 2])), schema, "f.parquet", target=target)
    with pytest.raises(DataError, match="more than once") as e:
        conform_table(good.append_column("ad_id", pa.array([1, 2])), schema, "f.parquet", target=target)
    assert e.value.column == "ad_id"
    # nulls in a non-nullable column are still found through a cached plan
    nulls = good.set_column(0, target.field(0).name, pa.array([0, None], type=pa.int64()))
    for _ in range(2):
        with pytest.raises(DataError, match="null value") as e:
            conform_table(nulls, schema, "f.parquet", target=target)
        assert e.value.row == 1


def test_min_max_id_check_counts_every_repair_and_names_refused_rows(schema) -> None:  # type: ignore
    enc = RequestEncoder(schema)
    vocab = next(f.vocab for f in schema.sparse if f.name == "ad_id")
    ids = [3, vocab + 4, 2 * vocab + 1, 5]
    table = enc._conformed(enc.table_of({"surface": 0, "candidates": [
        dict(zip(_candidates(4, ad_id=ids), row, strict=True))
        for row in zip(*_candidates(4, ad_id=ids).values(), strict=True)]}))
    cols = Columns.from_arrow(table, schema)
    for keep in (0, 100):
        log = ProblemLog(raise_errors=True, keep=keep)
        out = check_columns(cols, schema, "request", log)
        assert out.lists["ad_id"][1].tolist() == [i % vocab for i in ids]
        assert sum(log.counts.values()) == 2 and len(log.samples) == (2 if keep else 0)
        if keep:
            assert [p.row for p in log.samples] == [1, 2]
    in_range = check_columns(cols, schema, "request", ProblemLog(keep=0))
    assert in_range.lists["user_id"][1] is cols.lists["user_id"][1]  # nothing to repair: not copied
    with pytest.raises(BadRequest, match=r"candidate 2: feature 'user_id': negative id"):
        enc.batch([{"surface": 0, "candidates": pa.table(_candidates(3, user_id=[1, 2, -3]))}])


def test_merged_layout_follows_the_schema_and_refuses_bad_bodies(schema) -> None:  # type: ignore
    enc = RequestEncoder(schema)
    ints = pa.table(_candidates(3))
    floats = pa.table({**_candidates(3), "ad_quality": pa.array([0.5] * 3, type=pa.float32())})
    reordered = ints.select(list(reversed(ints.column_names)))
    reference = None
    for body in (ints, ints, floats, reordered, ints):  # the cached layout changes with the schema
        batch, counts = enc.batch([{"surface": 1, "candidates": body}])
        assert counts == [3]
        slow, _ = RequestEncoder(schema).batch([{"surface": 1, "candidates": body.to_pylist()}])
        assert batch.dense.equal(slow.dense) and batch.sparse.values().equal(slow.sparse.values())
        assert batch.surface.tolist() == [1] * 3
        reference = reference if reference is not None else batch
        assert batch.sparse.values().equal(reference.sparse.values())
    two, counts = enc.batch([{"surface": 0, "candidates": ints}, {"surface": 2, "candidates": ints}])
    assert counts == [3, 3] and two.surface.tolist() == [0] * 3 + [2] * 3
    with pytest.raises(BadRequest, match="missing feature 'ad_id'"):
        enc.batch([{"surface": 0, "candidates": ints.drop_columns(["ad_id"])}])
    with pytest.raises(BadRequest, match="unknown feature 'zz'"):
        enc.batch([{"surface": 0, "candidates": ints.append_column("zz", pa.array([1, 2, 3]))}])
    with pytest.raises(BadRequest, match="request 1: candidate 1: missing feature 'ad_id'"):
        enc.batch([{"surface": 0, "candidates": ints},
                   {"surface": 0, "candidates": pa.table(_candidates(3, ad_id=[1, None, 2]))}])
    empty_lists = pa.table(_candidates(3, user_interests=[[]] * 3))  # list<null>: retyped by the slow path
    batch, _ = enc.batch([{"surface": 0, "candidates": empty_lists}])
    assert batch.sparse["user_interests"].lengths().tolist() == [0] * 3


@pytest.mark.parametrize("max_len", [1, 4, 16, 100])
def test_truncation_keeps_the_last_events_of_each_row(max_len: int) -> None:
    rng = np.random.default_rng(max_len)
    ln = rng.integers(0, 20, 300)
    ln[:3] = 0  # empty rows first and in the middle
    ln[150] = 0
    v = np.arange(int(ln.sum()))
    slow = np.arange(len(v)) >= np.repeat(np.cumsum(ln) - np.minimum(ln, max_len), ln)  # the old mask
    other = rng.integers(0, 20, 300)  # a field whose lengths differ: truncated by its own lengths
    group = {"a": (ln, v), "b": (ln.copy(), v * 2), "c": (other, np.arange(int(other.sum())))}
    out = parquet._truncate(group, max_len)
    assert out["a"][0].tolist() == np.minimum(ln, max_len).tolist()
    assert out["a"][1].tolist() == v[slow].tolist()
    assert out["b"][1].tolist() == (v * 2)[slow].tolist()
    want_c = np.concatenate([np.arange(e - min(n, max_len), e) for n, e in zip(other, np.cumsum(other))])
    assert out["c"][1].tolist() == want_c.tolist()
    empty = parquet._truncate({"a": (ln[:0], v[:0])}, max_len)
    assert empty["a"][0].shape == (0,) and empty["a"][1].shape == (0,)


USER = ("user_id", "user_interests", "hist__item", "hist__action", "hist__dt")


def _user(u: int) -> dict:
    """One user's context: a different id, interests and history per user (the last user's lists empty)."""
    events = max(0, 3 - u // 9)
    return {"user_id": u, "user_interests": [u % 7, 1][: max(0, 2 - u // 9)],
            "hist__item": [u % 50, 4, 5][:events], "hist__action": [1, 0, 2][:events],
            "hist__dt": [0.5, 0.25, 0.125][:events]}


def _ads(n: int, start: int) -> dict[str, list]:
    return {"ad_id": [start + i for i in range(n)], "ad_category": [(start + i) % 3 for i in range(n)],
            "ad_quality": [0.25 * i for i in range(n)], "user_activity": [-1.0] * n}


def _assert_same_batch(a, b) -> None:  # type: ignore[no-untyped-def]
    assert a.dense.equal(b.dense) and a.surface.equal(b.surface)
    assert a.sparse.keys() == b.sparse.keys()
    assert a.sparse.values().equal(b.sparse.values()) and a.sparse.lengths().equal(b.sparse.lengths())
    for name, s in a.sequences.items():
        t = b.sequences[name]
        assert s.lengths.equal(t.lengths)
        assert all(s.ids[k].equal(t.ids[k]) for k in s.ids)
        assert all(s.dense[k].equal(t.dense[k]) for k in s.dense)


def test_context_requests_merge_and_equal_the_same_rows_sent_per_candidate(schema) -> None:  # type: ignore
    """A ranking request (one user's context, N ads) takes the merged Arrow path, each request's context
    broadcast to its own candidates only, and its Batch is the one of the same rows with the user's features
    in every candidate, in Arrow or JSON, alone or merged."""
    enc = RequestEncoder(schema)
    users, sizes = [3, 11, 27], [4, 1, 3]  # user 27: no interests, no events
    with_context = [{"surface": i % 3, "ts": 5 + i, "context": _user(u),
                     "candidates": pa.table(_ads(n, 10 * i))}
                    for i, (u, n) in enumerate(zip(users, sizes, strict=True))]
    per_candidate = [{"surface": r["surface"], "ts": r["ts"], "candidates": pa.table(
        {**_ads(n, 10 * i), **{k: [v] * n for k, v in _user(u).items()}})}
        for i, (r, u, n) in enumerate(zip(with_context, users, sizes, strict=True))]
    as_json = [{**r, "candidates": r["candidates"].to_pylist()} for r in with_context]
    assert enc._merged_arrow(with_context) is not None
    want, counts = enc.batch(per_candidate)
    assert counts == sizes
    for requests in (with_context, as_json):
        got, got_counts = enc.batch(requests)
        assert got_counts == sizes
        _assert_same_batch(got, want)
    for i in range(3):  # each alone (the one-request path) equals its slice of the merged batch
        alone, _ = enc.batch([with_context[i]])
        reference, _ = enc.batch([per_candidate[i]])
        _assert_same_batch(alone, reference)
    # contexts naming different features: the per-request path, the same rows
    mixed = [with_context[0], {**per_candidate[1]}, with_context[2]]
    assert enc._merged_arrow(mixed) is None
    _assert_same_batch(enc.batch(mixed)[0], want)


def test_bad_context_values_are_named_like_before(schema) -> None:  # type: ignore[no-untyped-def]
    enc = RequestEncoder(schema)
    good = {"surface": 0, "context": _user(3), "candidates": pa.table(_ads(2, 0))}
    for feature, value, why in [("user_id", "x", "takes one integer id"),
                                ("hist__item", [1, "a"], "takes a list of integer ids"),
                                ("hist__dt", 0.5, "takes a list")]:
        bad = {**good, "context": {**_user(3), feature: value}}
        assert enc._merged_arrow([good, bad]) is None
        with pytest.raises(BadRequest, match=rf"request 1: context: feature '{feature}' {why}"):
            enc.batch([good, bad])
    twice = {**good, "candidates": pa.table({**_ads(2, 0), "user_id": [1, 2]})}
    with pytest.raises(BadRequest, match="'user_id' is in the context and in the candidates"):
        enc.batch([twice])
    missing = {**good, "context": {k: v for k, v in _user(3).items() if k != "hist__dt"}}
    with pytest.raises(BadRequest, match="missing feature 'hist__dt'"):
        enc.batch([missing])
