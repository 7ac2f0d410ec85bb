"""The Predictor (issue 16 part A): raw values go through the loader's own encoding (no training/serving
skew), context features broadcast, one forward pass per score_many, and every bad request is one
BadRequest line, never another exception."""

from __future__ import annotations

import copy
import math
import random
import tomllib
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from opengem.config import from_dict
from opengem.data.dataset import Dataset
from opengem.data.loader import ParquetLoader
from opengem.data.schema import FeatureSchema
from opengem.data.sim_config import SimConfig
from opengem.data.simulate import simulate
from opengem.model.registry import ModelConfig, build_model
from opengem.serve.errors import BadRequest
from opengem.serve.export import make_artifact
from opengem.serve.predictor import Predictor
from opengem.transfer.vertical import VMSchemaConfig, derive_vm_schema

ROOT = Path(__file__).resolve().parents[1]
warnings.filterwarnings("ignore", category=FutureWarning)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """configs/transfer.toml's simulator, few rows: histories up to 16 events, ids over the VM's caps."""
    t = tomllib.loads((ROOT / "configs" / "transfer.toml").read_text())
    out = tmp_path_factory.mktemp("pred") / "data"
    simulate(SimConfig.from_dict({**t["data"]["sim"], "rows": 1200, "days": 2, "chunk_rows": 1200}), out)
    return out, t


def predictor(schema, cfg: ModelConfig) -> Predictor:
    torch.manual_seed(0)
    model = build_model(schema, cfg).eval()
    return Predictor(make_artifact(model, schema, cfg, "v0001", 99), backend="eager")


@pytest.fixture(scope="module")
def fm(data):
    """A small GEM on the full simulator schema."""
    path, _ = data
    schema = Dataset(path).schema
    cfg = from_dict(ModelConfig, tomllib.loads((ROOT / "configs" / "tiny.toml").read_text())["model"])
    return predictor(schema, cfg), path


@pytest.fixture(scope="module")
def fm_match(data):
    """The same GEM on the simulator schema with history-vs-ad counts derived (category and item)."""
    path, _ = data
    d = Dataset(path).schema.to_dict()
    d["match_features"] = [{"sequence": "hist", "field": "category", "feature": "ad_category", "recent": 4},
                           {"sequence": "hist", "field": "item", "feature": "ad_id"}]
    schema = FeatureSchema.from_dict(d, source="test")
    cfg = from_dict(ModelConfig, tomllib.loads((ROOT / "configs" / "tiny.toml").read_text())["model"])
    return predictor(schema, cfg), path


@pytest.fixture(scope="module")
def vm(data):
    """configs/transfer.toml's vertical model: capped tables (ids hashed), 4-event histories."""
    path, t = data
    schema = derive_vm_schema(Dataset(path).schema, from_dict(VMSchemaConfig, t["vm"]["schema"]), name="vm")
    return predictor(schema, from_dict(ModelConfig, t["vm"]["model"])), path


def rows_of_one_surface(path: Path, schema, n: int, tmp: Path) -> tuple[list[dict], Path]:
    """The first ``n`` rows of surface 0 as raw dicts, and the same rows as a Parquet file for the loader."""
    table = pq.read_table(Dataset(path).files("@all")[0])
    table = table.filter(pa.compute.equal(table[schema.surface_column], 0)).slice(0, n)
    i = table.schema.get_field_index(schema.time_column)  # one request is one moment: the schema's time
    table = table.set_column(i, table.schema.field(i), pa.array([table[i][0].as_py()] * n, pa.int64()))
    f = tmp / "rows.parquet"
    pq.write_table(table, f)
    return table.to_pylist(), f


def request_of(rows: list[dict], schema, context: tuple[str, ...] = ()) -> dict:
    feats = schema.feature_columns()
    return {"surface": schema.surfaces[0], "ts": rows[0][schema.time_column],  # the rows' time (features)
            "context": {k: rows[0][k] for k in context},
            "candidates": [{k: r[k] for k in feats if k not in context} for r in rows]}


def assert_same_inputs(a, b, schema) -> None:
    assert torch.equal(a.dense, b.dense) and torch.equal(a.surface, b.surface)
    da, db = a.sparse.to_dict(), b.sparse.to_dict()
    for f in schema.sparse:
        assert torch.equal(da[f.name].values(), db[f.name].values()), f.name
        assert torch.equal(da[f.name].lengths(), db[f.name].lengths()), f.name
    for g in schema.sequences:
        sa, sb = a.sequences[g.name], b.sequences[g.name]
        assert torch.equal(sa.lengths, sb.lengths)
        for k in sa.ids:
            assert torch.equal(sa.ids[k], sb.ids[k]), k
        for k in sa.dense:
            assert torch.equal(sa.dense[k], sb.dense[k]), k


@pytest.mark.parametrize("which", ["fm", "vm", "fm_match"])
def test_raw_rows_through_the_predictor_equal_the_loaders_rows(which, request, tmp_path):
    """Same rows, read by the training loader and sent raw to the Predictor: identical model inputs (the VM
    hashes ids past its capped tables and keeps the newest 4 events, in both) and identical scores."""
    p, path = request.getfixturevalue(which)
    rows, f = rows_of_one_surface(path, p.schema, 48, tmp_path)
    loader_batch = next(iter(ParquetLoader([f], p.schema, 48, drop_last=False)))
    req = request_of(rows, p.schema)
    served, counts = p.encode([req])
    assert counts == [48]
    assert_same_inputs(served, loader_batch, p.schema)
    if which == "fm_match":  # the derived counts are in both, and some rows' histories hold the ad's category
        assert loader_batch.dense.shape[1] == p.schema.num_dense_inputs == len(p.schema.dense_input_names)
        assert loader_batch.dense[:, -4].max() > 0
    if which == "vm":  # the repairs really happened on these rows
        caps = {x.name: x.vocab for x in p.schema.sparse}
        assert any(r["ad_id"] >= caps["ad_id"] for r in rows)
        assert any(len(r["hist__item"]) > 4 for r in rows)
    with torch.no_grad():
        want = torch.sigmoid(p.model(loader_batch).logits).tolist()
    got = p.score(req)
    assert got["version"] == "v0001"
    for j, task in enumerate(p.tasks):
        assert got["scores"][task] == [w[j] for w in want]


def test_context_features_broadcast_to_every_candidate(fm, tmp_path):
    p, path = fm
    rows, _ = rows_of_one_surface(path, p.schema, 6, tmp_path)
    user = tuple(k for k in p.schema.feature_columns() if k.startswith(("user_", "hist__")))
    assert "user_id" in user and "hist__item" in user
    spread = [dict(r, **{k: rows[0][k] for k in user}) for r in rows]  # the same user for every candidate
    assert p.score(request_of(rows, p.schema, context=user)) == p.score(request_of(spread, p.schema))


def test_score_many_is_one_forward_pass_with_replies_in_order(fm, tmp_path):
    p, path = fm
    rows, _ = rows_of_one_surface(path, p.schema, 9, tmp_path)
    reqs = [request_of(rows[:2], p.schema), request_of(rows[2:7], p.schema), request_of(rows[7:], p.schema)]
    calls = []
    forward = p._forward
    p._forward = lambda b: (calls.append(b.batch_size), forward(b))[1]
    try:
        replies = p.score_many(reqs)
    finally:
        p._forward = forward
    assert calls == [9]
    for req, reply in zip(reqs, replies):
        alone = p.score(req)
        for t in p.tasks:
            assert len(reply["scores"][t]) == len(req["candidates"])
            assert reply["scores"][t] == pytest.approx(alone["scores"][t], abs=1e-6)


def _valid(p, rows) -> dict:
    return request_of(rows[:3], p.schema)


BAD = {
    "not an object": lambda r: [r],
    "unknown request key": lambda r: {**r, "extra": 1},
    "missing surface": lambda r: {k: v for k, v in r.items() if k != "surface"},
    "unknown surface": lambda r: {**r, "surface": "nope"},
    "surface out of range": lambda r: {**r, "surface": 99},
    "surface of wrong type": lambda r: {**r, "surface": 1.5},
    "candidates not a list": lambda r: {**r, "candidates": {"a": 1}},
    "no candidates": lambda r: {**r, "candidates": []},
    "candidate not an object": lambda r: {**r, "candidates": [1, 2]},
    "context not an object": lambda r: {**r, "context": [1]},
    "unknown feature": lambda r: {**r, "context": {"shoe_size": 3}},
    "feature in context and candidate": lambda r: {**r, "context": {"ad_id": 1}},
    "missing feature": lambda r: {**r, "candidates": [{k: v for k, v in c.items() if k != "bid"}
                                                      for c in r["candidates"]]},
    "missing in one candidate": lambda r: {**r, "candidates": [r["candidates"][0],
                                                              {k: v for k, v in r["candidates"][1].items()
                                                               if k != "ad_id"}]},
    "string id": lambda r: _set(r, "ad_id", "abc"),
    "bool id": lambda r: _set(r, "ad_id", True),
    "float id": lambda r: _set(r, "ad_id", 1.5),
    "id too big for int64": lambda r: _set(r, "ad_id", 2 ** 70),
    "list for a scalar": lambda r: _set(r, "ad_id", [1, 2]),
    "scalar for a list": lambda r: _set(r, "hist__item", 3),
    "string in a list": lambda r: _set(r, "hist__item", [1, "x"]),
    "string dense": lambda r: _set(r, "bid", "1.0"),
    "NaN dense": lambda r: _set(r, "bid", math.nan),
    "infinite dense": lambda r: _set(r, "bid", math.inf),
    "NaN in a sequence": lambda r: _set(r, "hist__dt", [math.nan] * len(r["candidates"][0]["hist__item"])),
    "negative id": lambda r: _set(r, "user_id", -1),
    "id beyond vocabulary": lambda r: _set(r, "user_id", 10 ** 9),
    "history fields of different lengths": lambda r: _set(r, "hist__action", [1] * 40),
    "history longer than max_len": lambda r: _set_hist(r, 40),
}


def _set(r: dict, key: str, value) -> dict:
    r = copy.deepcopy(r)
    r["candidates"][1][key] = value
    return r


def _set_hist(r: dict, n: int) -> dict:
    r = copy.deepcopy(r)
    c = r["candidates"][1]
    for k in list(c):
        if k.startswith("hist__"):
            c[k] = [1.0 if k == "hist__dt" else 1] * n
    return r


@pytest.mark.parametrize("case", sorted(BAD))
def test_every_bad_request_is_one_bad_request_line(fm, case, tmp_path):
    p, path = fm
    rows, _ = rows_of_one_surface(path, p.schema, 3, tmp_path)
    bad = BAD[case](_valid(p, rows))
    with pytest.raises(BadRequest) as e:
        p.score(bad)
    msg = str(e.value)
    assert msg and "\n" not in msg
    assert p.score(_valid(p, rows))["scores"]  # and the predictor still serves


def test_too_many_candidates_and_bad_request_lists(fm, tmp_path):
    p, path = fm
    rows, _ = rows_of_one_surface(path, p.schema, 3, tmp_path)
    small = Predictor(p.artifact, backend="eager", max_candidates=2)
    with pytest.raises(BadRequest, match="too many candidates: 3"):
        small.score(_valid(p, rows))
    with pytest.raises(BadRequest, match="request 1: surface 'nope' is not one of"):
        p.score_many([_valid(p, rows), {**_valid(p, rows), "surface": "nope"}])
    with pytest.raises(BadRequest):
        p.score_many("not a list")  # type: ignore[arg-type]


def test_vm_schema_repairs_rather_than_refuses(vm, tmp_path):
    """A VM's schema hashes out-of-vocabulary ids (as its loader did): an id past the cap scores as its
    hash, not as an error."""
    p, path = vm
    rows, _ = rows_of_one_surface(path, p.schema, 2, tmp_path)
    req = request_of(rows, p.schema)
    cap = p.schema.sparse_feature("ad_id").vocab
    big, small = copy.deepcopy(req), copy.deepcopy(req)
    big["candidates"][0]["ad_id"] = 3 * cap + 5
    small["candidates"][0]["ad_id"] = 5
    assert p.score(big) == p.score(small)


def test_random_garbage_never_raises_anything_but_bad_request(fm, tmp_path):
    p, path = fm
    rows, _ = rows_of_one_surface(path, p.schema, 3, tmp_path)
    base = _valid(p, rows)
    keys = list(base["candidates"][0])
    junk = [None, "", "x", -1, 0, 2 ** 63, -(2 ** 63) - 1, 1e308, -1e308, math.nan, [], [None], [[1]], {},
            {"a": 1}, True, b"bytes", 3.5, [1.5, 2], [-5]]
    rng = random.Random(0)
    outcomes = {"ok": 0, "bad": 0}
    for _ in range(300):
        r = copy.deepcopy(base)
        for _ in range(rng.randint(1, 3)):
            where = rng.random()
            if where < 0.7 and isinstance(r["candidates"], list) and len(r["candidates"]) == 3:
                r["candidates"][rng.randrange(3)][rng.choice(keys)] = rng.choice(junk)
            elif where < 0.85 and isinstance(r["context"], dict):
                r["context"][rng.choice(keys + ["zz"])] = rng.choice(junk)
            else:
                r[rng.choice(["surface", "candidates", "context"])] = rng.choice(junk)
        try:
            reply = p.score(r)
            assert all(len(v) == len(r["candidates"]) for v in reply["scores"].values())
            outcomes["ok"] += 1
        except BadRequest as e:
            assert "\n" not in str(e)
            outcomes["bad"] += 1
    assert outcomes["bad"] > 200  # the junk was mostly refused, one line each


def _same_batch(a, b) -> None:
    assert torch.equal(a.dense, b.dense) and torch.equal(a.surface, b.surface)
    sa, sb = a.sparse.to_dict(), b.sparse.to_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k].values(), sb[k].values()) and torch.equal(sa[k].lengths(), sb[k].lengths())
    for g in a.sequences:
        assert torch.equal(a.sequences[g].offsets, b.sequences[g].offsets)
        for f in a.sequences[g].ids:
            assert torch.equal(a.sequences[g].ids[f], b.sequences[g].ids[f])


@pytest.mark.parametrize("which", ["fm", "vm"])
def test_json_fast_path_slow_path_and_arrow_table_give_the_same_batch(which, fm, vm, tmp_path):
    """The vectorised JSON path, the per-value path (numpy scalars and tuples force it) and an Arrow
    table of candidates (no dict per candidate) make the same model input, and the one the loader
    makes from the same rows."""
    from opengem.serve import arrow_io

    p, path = {"fm": fm, "vm": vm}[which]
    rows, f = rows_of_one_surface(path, p.schema, 9, tmp_path)
    req = request_of(rows, p.schema)
    fast, counts = p.encode([req])
    slow_req = copy.deepcopy(req)
    for c in slow_req["candidates"]:
        for k, v in c.items():
            c[k] = tuple(v) if isinstance(v, list) else (np.int64(v) if isinstance(v, int) else v)
    slow, _ = p.encode([slow_req])
    table_req = arrow_io.decode_request(arrow_io.encode_request(req), tables=True)  # ts rides along
    assert isinstance(table_req["candidates"], pa.Table)
    table, _ = p.encode([table_req])
    loader = next(iter(ParquetLoader([f], p.schema, 9, drop_last=False)))
    for other in (slow, table, loader):
        _same_batch(fast, other)
    assert counts == [9]


def test_arrow_body_carries_the_request_time_as_json_does(fm, tmp_path):
    """An Arrow body's ``ts`` (schema metadata, as ``ts`` is a key of a JSON request) is the request time:
    the same Batch as the JSON request with that ``ts``, on the per-request and the merged Arrow paths,
    and the hour-of-day feature follows it (absent, the server's clock would decide)."""
    from opengem.serve import arrow_io

    p, path = fm
    assert p.schema.time_features  # the simulator's schema derives the hour of the day from ts
    rows, _ = rows_of_one_surface(path, p.schema, 5, tmp_path)
    req = request_of(rows, p.schema)
    body = arrow_io.encode_request(req)
    decoded = arrow_io.decode_request(body, tables=True)
    assert decoded["ts"] == req["ts"] and isinstance(decoded["ts"], int)
    want, _ = p.encode([req])
    for reqs in ([decoded], [decoded, decoded]):  # one request: per-request path; two: merged tables
        got, _ = p.encode(reqs)
        assert got.ts.tolist() == [req["ts"]] * got.batch_size
        n = want.batch_size
        assert torch.equal(got.dense[:n], want.dense) and torch.equal(got.ts[:n], want.ts)
    later = arrow_io.decode_request(arrow_io.encode_request({**req, "ts": req["ts"] + 3 * 3600}),
                                    tables=True)
    moved, _ = p.encode([later])
    assert not torch.equal(moved.dense, want.dense)  # three hours later: another hour of the day


@pytest.mark.parametrize("ts", ["soon", "1.5", "--3", "1" * 25, ""])
def test_arrow_metadata_ts_that_is_not_an_integer_is_one_bad_request_line(ts):
    from opengem.serve import arrow_io

    table = pa.table({"ad_id": [1]}).replace_schema_metadata({"surface": "0", "ts": ts})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(BadRequest, match=r"^Arrow schema metadata 'ts' must be an integer time"):
        arrow_io.decode_request(sink.getvalue().to_pybytes(), tables=True)


def test_arrow_metadata_ts_past_int64_is_refused_by_the_predictor_as_for_json(vm, tmp_path):
    from opengem.serve import arrow_io

    p, path = vm
    rows, _ = rows_of_one_surface(path, p.schema, 2, tmp_path)
    req = {**request_of(rows, p.schema), "ts": 2 ** 63}
    with pytest.raises(BadRequest, match=r"'ts' must be an integer time"):
        p.score(arrow_io.decode_request(arrow_io.encode_request(req), tables=True))


def test_arrow_table_candidates_refuse_in_one_line_naming_the_feature(vm, tmp_path):
    p, path = vm
    rows, _ = rows_of_one_surface(path, p.schema, 3, tmp_path)
    base = pa.Table.from_pylist(request_of(rows, p.schema)["candidates"])

    def refused(table: pa.Table, context: dict | None = None) -> str:
        with pytest.raises(BadRequest) as e:
            p.score({"surface": 0, "context": context or {}, "candidates": table})
        assert "\n" not in str(e.value)
        return str(e.value)

    i = base.schema.get_field_index("ad_id")
    as_float = base.set_column(i, "ad_id", pa.array([1.5, 2.0, 3.0]))
    assert "'ad_id'" in refused(as_float) and "wrong type double" in refused(as_float)
    as_text = base.set_column(i, "ad_id", pa.array(["a", "b", "c"]))
    assert "'ad_id'" in refused(as_text)
    holed = base.set_column(i, "ad_id", pa.array([1, None, 3], pa.int64()))
    assert refused(holed).startswith("candidate 1: missing feature 'ad_id'")
    assert "unknown feature 'shoe'" in refused(base.append_column("shoe", pa.array([1, 2, 3])))
    assert "give it once" in refused(base, {"ad_id": 4})
    assert "missing feature 'bid'" in refused(base.drop_columns(["bid"]))
    # in a batch: an Arrow table of other (castable) types merges with a JSON request; a bad one is named
    json_req = request_of(rows, p.schema)
    int32 = {"surface": 0, "ts": json_req["ts"],
             "candidates": base.set_column(i, "ad_id", base.column("ad_id").cast(pa.int32()))}
    a, b = (r["scores"][p.tasks[0]] for r in p.score_many([int32, json_req]))
    assert np.allclose(a, b, atol=1e-6)
    with pytest.raises(BadRequest, match=r"^request 1: feature 'ad_id'"):
        p.score_many([json_req, {"surface": 0, "candidates": as_float}])


def test_a_bad_row_in_a_batch_is_named_by_request_and_candidate(fm, tmp_path):
    """The loader's row checks run once over the whole batch; a refusal still names the request and the
    candidate it came from."""
    p, path = fm
    rows, _ = rows_of_one_surface(path, p.schema, 3, tmp_path)
    good = _valid(p, rows)
    bad = _set(good, "user_id", 10 ** 9)  # beyond the vocabulary: the fm schema's policy is error
    with pytest.raises(BadRequest, match=r"^request 1: candidate 1: feature 'user_id'"):
        p.score_many([good, bad, good])
    with pytest.raises(BadRequest, match=r"^candidate 1: feature 'user_id'"):
        p.score(bad)
    assert [len(r["scores"][p.tasks[0]]) for r in p.score_many([good, good])] == [3, 3]


def _merged_path_spy(p, monkeypatch) -> list[bool]:
    """Record whether each encode took the merged Arrow path (the encoder's fast path for Arrow bodies)."""
    taken: list[bool] = []
    merged = p.encoder._merged_arrow

    def spy(requests):
        out = merged(requests)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(p.encoder, "_merged_arrow", spy)
    return taken


def test_arrow_requests_merge_into_one_table_as_the_per_request_path_would(vm, tmp_path, monkeypatch):
    """Arrow bodies of one schema are concatenated into ONE table and checked once (what dynamic batching
    merges); the Batch is the per-request path's, bit for bit (surfaces, times and candidate counts
    differing per request), and a refusal still names the request and the candidate."""
    p, path = vm
    rows, _ = rows_of_one_surface(path, p.schema, 12, tmp_path)
    cands = request_of(rows, p.schema)["candidates"]
    reqs = [{"surface": p.schema.surfaces[s], "ts": 1_700_000_000 + 5_000 * i,
             "candidates": pa.Table.from_pylist(cands[a:b])}
            for i, (a, b, s) in enumerate([(0, 5, 0), (5, 6, 1), (6, 12, 0)])]
    taken = _merged_path_spy(p, monkeypatch)
    merged, counts = p.encode(reqs)
    assert taken == [True] and counts == [5, 1, 6]
    monkeypatch.setattr(p.encoder, "_merged_arrow", lambda requests: None)
    alone, alone_counts = p.encode(reqs)
    _same_batch(merged, alone)
    assert alone_counts == counts
    for name in ("ts", "example_id", "surface"):
        assert torch.equal(getattr(merged, name), getattr(alone, name))
    assert merged.ts.tolist() == [r["ts"] for r, n in zip(reqs, counts) for _ in range(n)]
    assert merged.surface.tolist() == [0] * 5 + [1] + [0] * 6
    for g in merged.sequences:
        for f in merged.sequences[g].dense:
            assert torch.equal(merged.sequences[g].dense[f], alone.sequences[g].dense[f])


def test_merged_arrow_path_refuses_naming_request_and_candidate(vm, tmp_path, monkeypatch):
    p, path = vm
    rows, _ = rows_of_one_surface(path, p.schema, 6, tmp_path)
    table = pa.Table.from_pylist(request_of(rows, p.schema)["candidates"])
    i = table.schema.get_field_index("bid")
    nan_bid = table.set_column(i, "bid", pa.array([1.0, 2.0, 3.0, math.nan, 5.0, 6.0]))  # on_nan "error"
    taken = _merged_path_spy(p, monkeypatch)
    with pytest.raises(BadRequest, match=r"^request 2: candidate 3: feature 'bid'"):
        p.score_many([{"surface": 0, "candidates": t} for t in (table, table, nan_bid)])
    assert taken == [True]
    # what the merged path does not take (a null cell, a context) goes request by request, named as before
    holed = table.set_column(i, "bid", pa.array([1.0, None, 3.0, 4.0, 5.0, 6.0]))
    with pytest.raises(BadRequest, match=r"^request 1: candidate 1: missing feature 'bid'"):
        p.score_many([{"surface": 0, "candidates": t} for t in (table, holed)])
    with pytest.raises(BadRequest, match=r"^request 0: .*'bid'.*once"):
        p.score_many([{"surface": 0, "context": {"bid": 1.0}, "candidates": table},
                      {"surface": 0, "candidates": table}])
    assert taken[1:] == [False, False]
