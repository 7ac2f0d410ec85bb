"""Real-dataset adapters: canonical layout, documented row counts and label rates, causal histories.

Expected numbers come from each dataset's SOURCE.md (or are recomputed here from the raw files),
never from the adapter's own output.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from opengem.cli import main as cli_main
from opengem.data.adapters import ADAPTERS, convert
from opengem.data.adapters.common import AdapterError, Vocab, build_history
from opengem.data.dataset import Dataset, arrow_schema

REPO = Path(__file__).resolve().parents[1]
SPLITS = ("train", "valid", "test")


def _data_root() -> Path:
    env = os.environ.get("OPENGEM_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


def _src(name: str) -> Path:
    path = _data_root() / name
    if not path.is_dir():
        pytest.skip(f"real data not found at {path} (set $OPENGEM_DATA or provide ../shared/data)")
    return path


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory):
    """Full conversions, each done once per module and shared by the tests that need it."""
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            out = tmp_path_factory.mktemp(name)
            convert(name, _src(name), out)
            cache[name] = out
        return cache[name]

    return get


def _load(out: Path) -> tuple[Dataset, dict[str, pa.Table], dict]:
    ds = Dataset(out)
    tables = {s: pq.read_table(f) for s in SPLITS for f in ds.files(s)}
    summary = json.loads((out / "summary.json").read_text())
    return ds, tables, summary


def _check_canonical(out: Path) -> tuple[Dataset, dict[str, pa.Table], dict]:
    """Layout, exact Arrow schema, ids inside vocab, unique example ids, time-ordered splits."""
    ds, tables, summary = _load(out)
    schema = ds.schema
    assert list(tables) == list(SPLITS) and summary["partitions"] == list(SPLITS)
    for name, t in tables.items():
        assert t.schema.equals(arrow_schema(schema)), name
        assert summary["splits"][name]["rows"] == t.num_rows
    ids = np.concatenate([t[schema.example_id_column].to_numpy() for t in tables.values()])
    assert len(np.unique(ids)) == len(ids)
    for f in schema.sparse:
        for name, t in tables.items():
            col = pc.list_flatten(t[f.name]) if f.multi_valued else t[f.name]
            v = col.to_numpy()
            assert t[f.name].null_count == 0, (name, f.name)
            assert ((v >= 0) & (v < f.vocab)).all(), (name, f.name, v.min(), v.max(), f.vocab)
            if name == "train" and not f.multi_valued and f.name not in ("hour", "hour_of_day", "weekday"):
                # The vocabulary is the set of training values: every id 1..V-1 occurs in train.
                assert set(np.unique(v[v > 0])) == set(range(1, f.vocab)), f.name
    for g in schema.sequences:
        for name, t in tables.items():
            lens = pc.list_value_length(t[g.column(g.fields[0].name)]).to_numpy()
            assert lens.max(initial=0) <= g.max_len
            for f in g.fields:
                col = t[g.column(f.name)]
                assert (pc.list_value_length(col).to_numpy() == lens).all(), (name, f.name)
                if f.kind == "id":
                    v = pc.list_flatten(col).to_numpy()
                    assert ((v >= 0) & (v < f.vocab)).all(), (name, f.name)
    for t in tables.values():
        assert (t[schema.surface_column].to_numpy() < len(schema.surfaces)).all()
    return ds, tables, summary


def _check_time_order(tables: dict[str, pa.Table], strict: bool = True) -> None:
    bounds = [(pc.min(t["ts"]).as_py(), pc.max(t["ts"]).as_py()) for t in tables.values()]
    for (_, hi), (lo, _) in zip(bounds, bounds[1:]):
        assert hi < lo if strict else hi <= lo


def _overall_rates(tables: dict[str, pa.Table], tasks: list[str]) -> dict[str, float]:
    return {k: float(np.mean(np.concatenate([t[k].to_numpy() for t in tables.values()]))) for k in tasks}


def _check_history(tables: dict[str, pa.Table], item_col: str, group: str, item_field: str,
                   max_len: int, action_ok, sample: int = 300) -> None:
    """Recompute histories from the output rows themselves (by encoded user id) and compare."""
    t = pa.concat_tables(tables.values())
    ts, user, item = t["ts"].to_numpy(), t["user_id"].to_numpy(), t[item_col].to_numpy()
    eid = t["example_id"].to_numpy()
    hist_item = t[f"{group}__{item_field}"].to_pylist()
    hist_action = t[f"{group}__action"].to_pylist()
    dt = pc.list_flatten(t[f"{group}__dt"]).to_numpy()
    assert (dt > 0).all(), "a history event is not strictly earlier than its row"
    known = np.flatnonzero(user > 0)
    by_user: dict[int, np.ndarray] = {}
    for r in known[:: max(1, len(known) // sample)]:
        u = int(user[r])
        if u not in by_user:
            rows = np.flatnonzero(user == u)
            by_user[u] = rows[np.lexsort((eid[rows], ts[rows]))]
        rows = by_user[u]
        earlier = rows[ts[rows] < ts[r]][-max_len:]
        assert hist_item[r] == item[earlier].tolist(), f"row {eid[r]}: wrong history items"
        assert action_ok(t, earlier, np.array(hist_action[r], np.int64)), f"row {eid[r]}: wrong actions"


# --------------------------------------------------------------------------- no data needed
def test_build_history_strictly_earlier_and_truncated() -> None:
    user = np.array([1, 1, 2, 1, 1, 2, 1])
    ts = np.array([10, 20, 5, 20, 30, 5, 40])
    h = build_history(user, ts, max_len=2)
    got = [h.events[h.offsets[i]:h.offsets[i + 1]].tolist() for i in range(len(user))]
    # Ties (rows 1 and 3 at ts 20; rows 2 and 5) never see each other; the last 2 earlier events are kept.
    assert got == [[], [0], [], [0], [1, 3], [], [3, 4]]
    assert h.n_earlier.tolist() == [0, 1, 0, 1, 3, 0, 4]
    sub = h.take(np.array([6, 4]))
    assert sub.events.tolist() == [3, 4, 1, 3] and sub.rows.tolist() == [6, 4]


def test_vocab_reserves_zero_for_unknown() -> None:
    v = Vocab.fit(pa.array(["b", "a", None, "b"]))
    assert v.size == 3
    assert v.encode(pa.array(["a", "b", "zz", None])).tolist() == [1, 2, 0, 0]
    lst = v.encode_list(pa.array([["b", "q"], None, []]))
    assert lst.to_pylist() == [[2, 0], [], []]


def test_registry_names() -> None:
    assert set(ADAPTERS) == {"kuairand_pure", "frappe_x1", "movielens_100k", "movielens_latest_small",
                             "criteo_kaggle_head", "avazu_head"}


def test_missing_source_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(AdapterError, match="missing source file"):
        convert("criteo_kaggle_head", tmp_path, tmp_path / "out")
    assert cli_main(["convert", "avazu_head", "--src", str(tmp_path), "--out", str(tmp_path / "o")]) == 1
    assert "train.csv" in capsys.readouterr().err


def test_malformed_libsvm_names_line(tmp_path: Path) -> None:
    good = "1 0:1 957:1 5039:1 5046:1 5053:1 5055:1 5058:1 5060:1 5069:1 5149:1\n"
    (tmp_path / "valid.libsvm").write_text(good + good.replace("957:1", "5:1"))
    (tmp_path / "test.libsvm").write_text(good)
    with pytest.raises(AdapterError, match="line 2.*item"):
        convert("frappe_x1", tmp_path, tmp_path / "out")


# --------------------------------------------------------------------------- fast real-data tests
@pytest.mark.realdata
def test_kuairand_limited_histories_causal(tmp_path: Path) -> None:
    convert("kuairand_pure", _src("kuairand_pure"), tmp_path, limit=20_000)
    ds, tables, summary = _check_canonical(tmp_path)
    assert 0 < summary["rows"] <= 20_000 and all(t.num_rows > 0 for t in tables.values())
    _check_time_order(tables)
    def action_ok(t: pa.Table, rows: np.ndarray, got: np.ndarray) -> bool:
        want = 1 + t["is_click"].to_numpy()[rows] + 2 * t["long_view"].to_numpy()[rows]
        return np.array_equal(got, want)

    _check_history(tables, "video_id", "hist", "video", ds.schema.sequence("hist").max_len, action_ok)
    assert ds.schema.sequence("hist").fields[0].table == ds.schema.sparse_feature("video_id").table_name


@pytest.mark.realdata
def test_kuairand_cut_short_before_its_valid_day_is_refused(tmp_path: Path) -> None:
    """A log that ends before the valid and test days (each log file's first 15,000 rows) made a dataset
    with empty valid and test splits, marked complete, that its own validate refused."""
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    for f in _src("kuairand_pure").iterdir():
        if f.name.startswith("log_"):
            pq.write_table(pq.read_table(f).slice(0, 15_000), src / f.name)
        else:
            (src / f.name).symlink_to(f)
    with pytest.raises(AdapterError, match=r"the valid and test splits would have no rows .*convert more"):
        convert("kuairand_pure", src, out)
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.realdata
@pytest.mark.slow
def test_kuairand_full(converted) -> None:
    ds, tables, summary = _check_canonical(converted("kuairand_pure"))
    log = pa.concat_tables([pq.read_table(_src("kuairand_pure") / f, columns=["time_ms"]) for f in (
        "log_standard_20220425_20220430.parquet", "log_standard_20220501_20220508.parquet")])
    # Beijing-time calendar day of each exposure, recomputed independently of the adapter.
    day = ((log["time_ms"].to_numpy() // 1000 + 8 * 3600) // 86400).astype("datetime64[D]")
    expected = {"train": int((day < np.datetime64("2022-05-06")).sum()),
                "valid": int((day == np.datetime64("2022-05-06")).sum()),
                "test": int((day > np.datetime64("2022-05-06")).sum())}
    assert expected["test"] > 25_000 and expected["valid"] > 12_000
    assert {k: t.num_rows for k, t in tables.items()} == expected
    assert summary["rows"] == 228_329
    rates = _overall_rates(tables, ["is_click", "long_view", "is_like"])
    for k, want in {"is_click": 0.4419, "long_view": 0.3108, "is_like": 0.0171}.items():
        assert abs(rates[k] - want) < 6e-4, (k, rates[k])
    _check_time_order(tables)
    assert ds.schema.surfaces == ("tab0", "tab1", "tab2", "tab4", "tab6", "other")
    surf = tables["train"]["surface"].to_numpy()
    assert abs(np.mean(surf == 1) - 0.758) < 0.01  # tab1 ~ 75.8 % of rows


@pytest.mark.realdata
def test_frappe_limited(tmp_path: Path) -> None:
    convert("frappe_x1", _src("frappe_x1"), tmp_path, limit=2000)
    _, tables, summary = _check_canonical(tmp_path)
    assert {k: t.num_rows for k, t in tables.items()} == {"train": 1800, "valid": 200, "test": 2000}


@pytest.mark.realdata
def test_frappe_full(converted) -> None:
    ds, tables, summary = _check_canonical(converted("frappe_x1"))
    rows = {k: t.num_rows for k, t in tables.items()}
    assert rows["train"] + rows["valid"] == 57_722 and rows["test"] == 28_860
    assert rows["valid"] == round(0.1 * 57_722)
    assert abs(float(pc.sum(tables["train"]["click"]).as_py() + pc.sum(tables["valid"]["click"]).as_py())
               - 19_063) < 0.5
    assert abs(pc.sum(tables["test"]["click"]).as_py() - 9_536) < 0.5
    assert [f.name for f in ds.schema.sparse] == ["user", "item", "daytime", "weekday", "isweekend",
                                                  "homework", "cost", "weather", "country", "city"]
    assert ds.schema.sparse_feature("isweekend").vocab == 3  # two values + unknown


@pytest.mark.realdata
@pytest.mark.parametrize("name", ["movielens_100k", "movielens_latest_small"])
def test_movielens_limited_histories_causal(name: str, tmp_path: Path) -> None:
    convert(name, _src(name), tmp_path, limit=8000)
    ds, tables, _ = _check_canonical(tmp_path)
    _check_time_order(tables)
    # The action code is the rating (x2 for half-star ml-latest); rating >= 4 is the event's own label.
    top, like_from = (10, 8) if name.endswith("small") else (5, 4)

    def action_ok(t: pa.Table, rows: np.ndarray, got: np.ndarray) -> bool:
        like = t["like"].to_numpy()[rows]
        return bool(((got >= 1) & (got <= top)).all() and np.array_equal(got >= like_from, like == 1))

    _check_history(tables, "movie_id", "hist", "movie", ds.schema.sequence("hist").max_len, action_ok)


@pytest.mark.realdata
@pytest.mark.slow
@pytest.mark.parametrize("name,rows,rate", [("movielens_100k", 100_000, 0.5538),
                                            ("movielens_latest_small", 100_836, 0.4818)])
def test_movielens_full(name: str, rows: int, rate: float, converted) -> None:
    ds, tables, summary = _check_canonical(converted(name))
    assert summary["rows"] == rows
    assert abs(_overall_rates(tables, ["like"])["like"] - rate) < 5e-4
    _check_time_order(tables)
    for k, frac in zip(SPLITS, (0.8, 0.1, 0.1)):
        assert abs(tables[k].num_rows / rows - frac) < 0.005, k
    assert ds.schema.sparse_feature("genres").multi_valued


@pytest.mark.realdata
def test_criteo_limited_and_deterministic(tmp_path: Path) -> None:
    convert("criteo_kaggle_head", _src("criteo_kaggle_head"), tmp_path / "a", limit=300)
    convert("criteo_kaggle_head", _src("criteo_kaggle_head"), tmp_path / "b", limit=300)
    _, ta, _ = _check_canonical(tmp_path / "a")
    _, tb, _ = _load(tmp_path / "b")
    assert all(ta[k].equals(tb[k]) for k in SPLITS)
    assert (tmp_path / "a" / "schema.toml").read_text() == (tmp_path / "b" / "schema.toml").read_text()


@pytest.mark.realdata
def test_criteo_full(converted) -> None:
    ds, tables, _ = _check_canonical(converted("criteo_kaggle_head"))
    assert {k: t.num_rows for k, t in tables.items()} == {"train": 7200, "valid": 409, "test": 391}
    positives = {k: round(pc.sum(t["click"]).as_py()) for k, t in tables.items()}
    assert positives == {"train": 1549, "valid": 93, "test": 86}
    assert len(ds.schema.dense) == 26 and len(ds.schema.sparse) == 26
    tr = tables["train"]
    assert np.isfinite(tr["I1"].to_numpy()).all()
    miss = tr["I12_missing"].to_numpy()
    assert 0.5 < miss.mean() < 0.95 and (tr["I12"].to_numpy()[miss == 1] == 0).all()


@pytest.mark.realdata
def test_avazu_limited(tmp_path: Path) -> None:
    assert cli_main(["convert", "avazu_head", "--src", str(_src("avazu_head")), "--out", str(tmp_path),
                     "--limit", "400"]) == 0
    ds, tables, _ = _check_canonical(tmp_path)
    assert "id" not in ds.schema.feature_columns() and "hour" not in ds.schema.feature_columns()
    assert {k: t.num_rows for k, t in tables.items()} == {"train": 400, "valid": 400, "test": 400}


@pytest.mark.realdata
def test_avazu_full(converted) -> None:
    ds, tables, _ = _check_canonical(converted("avazu_head"))
    assert {k: t.num_rows for k, t in tables.items()} == {"train": 8087, "valid": 480, "test": 432}
    positives = {k: round(pc.sum(t["click"]).as_py()) for k, t in tables.items()}
    assert positives == {"train": 1397, "valid": 86, "test": 80}
    ts = tables["train"]["ts"].to_numpy()
    assert (ts == 1413849600).all()  # hour 14102100 = 2014-10-21 00:00 UTC
    assert (tables["train"]["hour_of_day"].to_numpy() == 1).all()


# --------------------------------------------------------------------------- Criteo's full release layout
def _criteo_release_lines(n: int, seed: int = 0) -> list[list[str]]:
    """Kaggle DAC train.txt rows: label, I1..I13 (empty ~25 %, I2 may be negative), C1..C26 8-hex-digit
    values (empty ~10 %, C26 empty on every 5th row so that the line ends with a tab)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        ints = ["" if rng.random() < 0.25 else str(int(rng.integers(-3 if k == 1 else 0, 500)))
                for k in range(13)]
        cats = ["" if rng.random() < 0.1 else f"{int(rng.zipf(1.5)) * 2654435761 % 2**32:08x}"
                for _ in range(26)]
        if i % 5 == 0:
            cats[-1] = ""
        rows.append([str(int(rng.random() < 0.25)), *ints, *cats])
    return rows


def test_criteo_full_release_layout_streams(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder holding the full release's train.txt (no header, TSV, empty fields) converts through the
    importer's streaming path: many small blocks and several shuffle buckets, never the whole file."""
    from opengem.data.adapters.sources import Source
    from opengem.data.adapters.table_split import uniform

    n = 3000
    lines = _criteo_release_lines(n)
    src = tmp_path / "dac"
    src.mkdir()
    (src / "train.txt").write_text("".join("\t".join(r) + "\n" for r in lines))
    assert (src / "train.txt").read_text().count("\t\n") >= n // 5  # the release's trailing empty field
    monkeypatch.setattr("opengem.data.adapters.sources.BLOCK_BYTES", 32 << 10)
    monkeypatch.setattr("opengem.data.adapters.table.SHUFFLE_BUCKET_ROWS", 500)
    sizes: list[int] = []
    real = Source.batches

    def batches(self, bad, columns=None):
        for path, batch in real(self, bad, columns):
            sizes.append(batch.num_rows)
            yield path, batch

    monkeypatch.setattr(Source, "batches", batches)
    assert cli_main(["convert", "criteo_kaggle_head", "--src", str(src), "--out", str(tmp_path / "o")]) == 0
    assert sum(sizes) == 2 * n and max(sizes) < n // 10  # two passes, each in many blocks
    ds, tables, summary = _check_canonical(tmp_path / "o")
    assert summary["dataset"] == "criteo_kaggle" and "full release train.txt" in summary["split_rule"]
    # the documented split: a seeded hash of the line number, 80/10/10
    t = pa.concat_tables(tables.values())
    eid = t["example_id"].to_numpy()
    assert sorted(eid) == list(range(n))
    u = uniform(np.arange(n), 0)
    want = {"test": u < 0.1, "valid": (u >= 0.1) & (u < 0.2), "train": u >= 0.2}
    for s in SPLITS:
        assert sorted(tables[s]["example_id"].to_pylist()) == np.flatnonzero(want[s]).tolist(), s
    assert not (np.diff(tables["train"]["example_id"].to_numpy()) > 0).all()  # shuffled in buckets
    # every value arrived with its own line
    src_rows = [lines[i] for i in eid]
    assert t["click"].to_pylist() == [float(r[0]) for r in src_rows]
    for k in (1, 2, 12):
        raw = [r[k] for r in src_rows]
        assert t[f"I{k}_missing"].to_pylist() == [float(v == "") for v in raw]
        want_i = np.log1p(np.maximum([float(v or 0) for v in raw], 0)).astype(np.float32)
        np.testing.assert_allclose(t[f"I{k}"].to_numpy(), want_i, rtol=1e-6)
    train = set(tables["train"]["example_id"].to_pylist())
    for c in (3, 26):  # C3: Zipf values (kept and rare); C26: often empty
        raw = [lines[i][13 + c] for i in eid]
        counts: dict[str, int] = {}
        for i in train:
            counts[lines[i][13 + c]] = counts.get(lines[i][13 + c], 0) + 1
        ids = t[f"C{c}"].to_pylist()
        kept = {v: i for v, i in zip(raw, ids) if v and counts.get(v, 0) >= 2}
        assert all((i == 0) == (not v or counts.get(v, 0) < 2) for v, i in zip(raw, ids)), c
        assert len(set(kept.values())) == len(kept)  # one id per kept value, and the same on every row
    # the file itself as --src: the same dataset
    assert cli_main(["convert", "criteo_kaggle_head", "--src", str(src / "train.txt"),
                     "--out", str(tmp_path / "f")]) == 0
    _, again, _ = _load(tmp_path / "f")
    assert all(again[s].equals(tables[s]) for s in SPLITS)
