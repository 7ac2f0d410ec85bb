import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from opengem import cli
from opengem.data.dataset import Dataset, arrow_schema
from opengem.data.oracle import NEAccumulator, oracle_ne
from opengem.data.schema import FeatureSchema
from opengem.data.sim_config import SimConfigError
from opengem.data.simulate import SimConfig, iter_batches, iter_record_batches, sim_schema, simulate

SMALL = dict(rows=3000, days=3, users=1000, ads=2000, advertisers=100, topics=40, seq_mean=20.0,
             seq_max=80, chunk_rows=700, conv_window_hours=12.0)


def small(**kw) -> SimConfig:
    return SimConfig(**{**SMALL, **kw})


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sim")
    simulate(small(), out)
    return out


def read_all(root: Path, columns=None) -> pa.Table:
    return pa.concat_tables(pq.read_table(f, columns=columns) for f in Dataset(root).files())


def truth_all(root: Path) -> pa.Table:
    return pa.concat_tables(pq.read_table(f) for f in Dataset(root).truth_files())


def data_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.parquet"))} | {
        "schema.toml": (root / "schema.toml").read_bytes()}


# ----------------------------------------------------------------------------- determinism
def test_same_seed_same_bytes_different_seed_differs(ds, tmp_path):
    simulate(small(), tmp_path / "a")
    assert data_bytes(tmp_path / "a") == data_bytes(ds)
    simulate(small(seed=1), tmp_path / "b")
    other = read_all(tmp_path / "b", ["ad_id", "user_id"])
    mine = read_all(ds, ["ad_id", "user_id"])
    assert not mine.equals(other)
    assert (mine["ad_id"].to_numpy() != other["ad_id"].to_numpy()).mean() > 0.5


def test_streaming_api_yields_exactly_the_written_rows(ds):
    """iter_record_batches (never the whole dataset in memory) == the Parquet files, row for row."""
    batches = list(iter_record_batches(small()))
    assert all(b.num_rows <= small().chunk_rows for b in batches)
    streamed = pa.Table.from_batches(batches)
    assert streamed.equals(read_all(ds).replace_schema_metadata(None))


# ----------------------------------------------------------------------------- schema conformance
def test_layout_and_schema(ds):
    schema = FeatureSchema.load(ds / "schema.toml")
    assert schema == sim_schema(small())
    assert Dataset(ds).partitions() == ["day=000", "day=001", "day=002"]
    want = arrow_schema(schema)
    for f in Dataset(ds).files():
        assert pq.read_schema(f).remove_metadata() == want, f
    tables = schema.tables()
    assert tables["item"][0] == small().ads  # ad_id and hist.item share one table
    assert {"ad_category", "user_interests"} <= {f.name for f in schema.sparse if f.table_name == "category"}
    summary = json.loads((ds / "summary.json").read_text())
    assert sum(summary["rows_per_day"].values()) == 3000
    assert set(summary["oracle_ne"]) == {f"{s}/{t}" for s in schema.surfaces for t in ("click", "conversion")}


def test_ids_in_vocab_lengths_order_and_unique_ids(ds):
    schema = FeatureSchema.load(ds / "schema.toml")
    t = read_all(ds)
    for f in schema.sparse:
        col = t[f.name]
        vals = pc.list_flatten(col) if f.multi_valued else col
        assert pc.min(vals).as_py() >= 0 and pc.max(vals).as_py() < f.vocab, f.name
    g = schema.sequence("hist")
    lengths = pc.list_value_length(t["hist__item"]).to_numpy()
    assert lengths.max() <= g.max_len and lengths.min() >= 0 and lengths.mean() > 5
    for fld in g.fields:
        col = t[g.column(fld.name)]
        assert np.array_equal(pc.list_value_length(col).to_numpy(), lengths), fld.name  # aligned
        if fld.kind == "id":
            v = pc.list_flatten(col)
            assert pc.min(v).as_py() >= 0 and pc.max(v).as_py() < fld.vocab, fld.name
    # history is oldest first: time-before-impression never increases along a row
    dt = pc.list_flatten(t["hist__dt"]).to_numpy()
    row = np.repeat(np.arange(len(lengths)), lengths)
    same_row = row[1:] == row[:-1]
    assert np.all(np.diff(dt)[same_row] <= 1e-6) and np.all(dt >= 0)
    ts = t["ts"].to_numpy()
    assert np.all(np.diff(ts) >= 0)
    cfg = small()
    for d, f in enumerate(Dataset(ds).files()):
        day_ts = pq.read_table(f, columns=["ts"])["ts"].to_numpy()
        assert day_ts.min() >= cfg.start_ts + d * 86400 and day_ts.max() < cfg.start_ts + (d + 1) * 86400
    ids = t["example_id"].to_numpy()
    assert len(np.unique(ids)) == len(ids)
    assert np.array_equal(truth_all(ds)["example_id"].to_numpy(), ids)
    surf = t["surface"].to_numpy()
    assert surf.min() >= 0 and surf.max() < len(schema.surfaces)


def test_large_vocab_and_long_sequences_stream(tmp_path):
    cfg = SimConfig(rows=300, days=1, users=10**7, ads=10**7, advertisers=10**5, seq_mean=500.0,
                    seq_max=2000, chunk_rows=150)
    batches = list(iter_record_batches(cfg))
    t = pa.Table.from_batches(batches)
    lengths = pc.list_value_length(t["hist__item"]).to_numpy()
    assert lengths.max() <= 2000 and lengths.max() > 1000
    for c in ("user_id", "ad_id"):
        v = t[c].to_numpy()
        assert v.min() >= 0 and v.max() < 10**7 and len(np.unique(v)) > 100  # Zipf, yet a long tail
    assert pc.max(pc.list_flatten(t["hist__item"])).as_py() < 10**7


# ----------------------------------------------------------------------------- labels
def test_label_rates_and_surfaces_differ(ds):
    t = read_all(ds, ["surface", "click", "conversion"])
    tr = truth_all(ds)
    click = t["click"].to_numpy()
    assert t["click"].null_count == 0
    assert 0.01 <= click.mean() <= 0.05
    conv = t["conversion"].to_numpy(zero_copy_only=False)
    obs = ~np.isnan(conv)
    assert 0 < conv[obs].mean() < click.mean()
    assert np.all(click[obs][conv[obs] == 1] == 1)  # a conversion implies a click
    surf = t["surface"].to_numpy()
    p = tr["p_click"].to_numpy()
    per_surface = np.array([p[surf == s].mean() for s in range(small().surfaces)])
    assert per_surface.max() / per_surface.min() > 1.8, per_surface
    assert np.all(tr["p_conversion"].to_numpy() <= p)


def test_conversion_nulls_only_near_the_end(ds):
    cfg = small()
    t = read_all(ds, ["ts", "conversion"])
    ts = t["ts"].to_numpy()
    null = t["conversion"].is_null().to_numpy(zero_copy_only=False)
    end = cfg.start_ts + cfg.days * 86400
    expect = ts + cfg.conv_window_hours * 3600 > end
    assert np.array_equal(null, expect)
    assert 0 < null.sum() < len(null) * 0.2


def test_oracle_ne_below_one_and_calibrated(ds):
    ne = oracle_ne(ds)
    summary = json.loads((ds / "summary.json").read_text())
    for k, v in ne.items():
        if summary["oracle_ne"][k] is None:  # a few thousand rows: a rare surface x task may lack positives
            assert np.isnan(v) and k.endswith("/conversion")
            continue
        assert v == pytest.approx(summary["oracle_ne"][k], rel=1e-9), k
        if k.endswith("/click"):
            assert 0.3 < v < 0.97, (k, v)
    t = read_all(ds, ["click", "conversion"])
    tr = truth_all(ds)
    for task in ("click", "conversion"):
        y = t[task].to_numpy(zero_copy_only=False)
        p = tr[f"p_{task}"].to_numpy()
        obs = ~np.isnan(y)
        n, mp = obs.sum(), p[obs].mean()
        assert abs(y[obs].mean() - mp) < 4 * np.sqrt(mp * (1 - mp) / n) + 1e-4, task
        acc = NEAccumulator()  # all surfaces pooled: enough conversions to score
        acc.update(task, p, y, obs)
        assert acc.ne(task) < 0.97, task


def test_recent_history_drives_clicks(ds):
    """The click probability is higher when the ad's topic appears in the last K history events."""
    t = read_all(ds, ["ad_category", "hist__category"])
    p = truth_all(ds)["p_click"].to_numpy()
    k = small().recent_k
    cat = t["ad_category"].to_numpy()
    hit = np.array([c in h[-k:] for c, h in zip(cat, t["hist__category"].to_pylist())])
    assert 0.05 < hit.mean() < 0.95
    assert p[hit].mean() > 1.5 * p[~hit].mean()


def test_concept_drift_changes_the_same_pair_across_days():
    """The same (user, ad, surface) scores differently on different days (rotating weights)."""
    from opengem.data.sim_core import World

    cfg = small()
    w = World(cfg)
    th0, th5 = w.w_phase[0], cfg.drift_rad_per_day * 5 + w.w_phase[0]
    a = np.cos(th0) * w.w_a[0] + np.sin(th0) * w.w_b[0]
    b = np.cos(th5) * w.w_a[0] + np.sin(th5) * w.w_b[0]
    assert np.corrcoef(a, b)[0, 1] < 0.9
    assert np.abs(w.day_probs(0.5) - w.day_probs(5.5)).sum() > 0.1  # topic popularity drifts


# ----------------------------------------------------------------------------- CLI and config errors
def test_cli_writes_and_refuses_to_overwrite(tmp_path, capsys):
    args = ["simulate", "--out", str(tmp_path), "--rows", "400", "--days", "2", "--users", "1000",
            "--ads", "1000", "--seq-mean", "5", "--seq-max", "20", "--quiet"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "feed/click" in out and "oracle NE" in out
    assert (tmp_path / "truth" / "day=001" / "part-00000.parquet").exists()
    assert cli.main(args) == 2
    assert "--force" in capsys.readouterr().err  # one line from the central handler (was printed on stdout)
    assert cli.main(args + ["--force", "--surfaces", "5"]) == 0
    assert len(FeatureSchema.load(tmp_path / "schema.toml").surfaces) == 5


@pytest.mark.parametrize("kw, key", [(dict(rows=0), "rows"), (dict(ads=10, topics=40), "ads"),
                                     (dict(seq_mean=100.0, seq_max=50), "seq_mean"),
                                     (dict(surfaces=0), "surfaces")])
def test_bad_config_names_the_key(kw, key):
    with pytest.raises(SimConfigError, match=key):
        next(iter_batches(small(**kw)))


def test_click_terms_make_up_the_true_logit_and_id_weight_scales_per_id_terms():
    """p_click is exactly sigmoid(intercept + hour + click_scale * sum of the named terms)."""
    from opengem.data.sim_core import World, chunk_plan, generate_chunk

    for idw in (0.5, 0.0):
        cfg = small(rows=600, id_weight=idw, click_scale=1.3)
        w = World(cfg)
        day, r0, r1 = chunk_plan(cfg)[0]
        ch = generate_chunk(w, day, r0, r1, 0)
        terms = ch.click_terms
        assert {"recent", "engaged", "cross2", "cross3", "id_latent"} <= set(terms)
        s = ch.columns["surface"]
        hour = ch.columns["hour_of_day"].astype(np.float64) * 24.0
        logit = w.sp[s, 1] + 0.25 * np.sin(2 * np.pi * hour / 24.0 + w.sp[s, 8]) + 1.3 * sum(terms.values())
        assert np.allclose(1 / (1 + np.exp(-logit)), ch.p_click, atol=1e-5)
        per_id = np.abs(terms["id_latent"]) + np.abs(terms["user_bias"]) + np.abs(terms["ad_bias"])
        assert (per_id.max() == 0) == (idw == 0)
        assert terms["cross2"].std() > 0.2 and terms["engaged"].max() > 0


def test_match_recent_declares_counts_without_changing_a_row(tmp_path):
    """data.sim.match_recent = k: the schema's match_features (ad vs history items, category vs history
    categories, latest k); the rows are those of the same config without them, and the loader's batches carry
    the counts after the clock."""
    from opengem.data.loader import ParquetLoader
    from opengem.data.match_features import first_values, match_feature_values

    plain, counted = small(rows=600), small(rows=600, match_recent=4)
    s = sim_schema(counted)
    assert [(m.field, m.feature, m.recent) for m in s.match_features] == [("item", "ad_id", 4),
                                                                          ("category", "ad_category", 4)]
    assert s.num_dense_inputs == sim_schema(plain).num_dense_inputs + 4
    simulate(plain, tmp_path / "a")
    simulate(counted, tmp_path / "b")
    rows_a, rows_b = (data_bytes(tmp_path / x) for x in "ab")
    assert rows_a.pop("schema.toml") != rows_b.pop("schema.toml") and rows_a == rows_b
    ds = Dataset(tmp_path / "b")
    b = next(iter(ParquetLoader(ds.files("@all"), ds.schema, 64, drop_last=False)))
    kjt = b.sparse.to_dict()
    hist = b.sequences["hist"]
    want = match_feature_values(hist.lengths.numpy(), hist.ids["category"].numpy(),
                                first_values(kjt["ad_category"].lengths().numpy(),
                                             kjt["ad_category"].values().numpy()), 4)
    assert np.array_equal(b.dense[:, -2:].numpy(), want) and want[:, 0].max() > 0
    with pytest.raises(SimConfigError, match="match_recent"):
        SimConfig.from_dict({"match_recent": -1})
