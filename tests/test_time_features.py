"""Time-of-request context features (issue 14, calibration): the hour of the day and the day of the week as
(sin, cos) dense inputs, derived from the time column in the one encoding path (``to_batch``) that the
loader and the Predictor share, declared in the schema, and sized into every model."""

from __future__ import annotations

import dataclasses
import math
import tomllib
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from opengem.data.dataset import Dataset
from opengem.data.loader import ParquetLoader
from opengem.data.parquet import Columns, to_batch
from opengem.data.random_batch import random_batch
from opengem.data.schema import FeatureSchema, SchemaError
from opengem.data.sim_config import SimConfig, sim_schema
from opengem.data.simulate import simulate
from opengem.data.time_features import time_feature_values, time_phase
from opengem.model.registry import MODEL_NAMES, ModelConfig, build_model
from opengem.serve.errors import BadRequest
from opengem.serve.export import make_artifact
from opengem.serve.predictor import Predictor
from opengem.transfer.vertical import VerticalModel, VMSchemaConfig, derive_vm_schema

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "schemas" / "tiny.toml"
warnings.filterwarnings("ignore", category=FutureWarning)

MONDAY = 1_700_438_400  # 2023-11-20 00:00:00 UTC, a Monday
H = 3600


def tiny(time_features: list[str] | None = None, unit: str | None = None) -> FeatureSchema:
    d = tomllib.loads(TINY.read_text())
    if time_features is not None:
        d["time_features"] = time_features
    if unit is not None:
        d["time_unit"] = unit
    return FeatureSchema.from_dict(d)


# ----------------------------------------------------------------------------------------- values
@pytest.mark.parametrize("offset_s, hour_phase, week_phase", [
    (0, 0.0, 0.0),                          # Monday 00:00
    (6 * H, 0.25, 0.25 / 7),                # Monday 06:00
    (12 * H, 0.5, 0.5 / 7),                 # Monday 12:00
    (86_400 - 1, 86_399 / 86_400, 86_399 / 86_400 / 7),  # Monday 23:59:59: one second before the boundary
    (86_400, 0.0, 1 / 7),                   # Tuesday 00:00: the day boundary wraps the hour to 0
    (3 * 86_400 + 18 * H, 0.75, 3.75 / 7),  # Thursday 18:00
    (7 * 86_400 - 1, 86_399 / 86_400, 1 - 1 / 604_800),  # Sunday 23:59:59
    (7 * 86_400, 0.0, 0.0),                 # the next Monday 00:00: the week wraps
])
def test_phases_at_known_times(offset_s, hour_phase, week_phase):
    ts = np.array([MONDAY + offset_s])
    assert time_phase(ts, "hour_of_day")[0] == pytest.approx(hour_phase, abs=1e-12)
    assert time_phase(ts, "day_of_week")[0] == pytest.approx(week_phase, abs=1e-12)
    v = time_feature_values(ts, ("hour_of_day", "day_of_week"))[0]
    want = [math.sin(2 * math.pi * hour_phase), math.cos(2 * math.pi * hour_phase),
            math.sin(2 * math.pi * week_phase), math.cos(2 * math.pi * week_phase)]
    np.testing.assert_allclose(v, want, atol=1e-6)


def test_sin_cos_at_hour_0_6_12_18():
    ts = MONDAY + np.array([0, 6, 12, 18]) * H
    v = time_feature_values(ts, ("hour_of_day",))
    np.testing.assert_allclose(v, [[0, 1], [1, 0], [0, -1], [-1, 0]], atol=1e-6)


def test_the_unix_epoch_is_a_thursday_and_units_agree():
    assert time_phase(np.array([0]), "day_of_week")[0] == pytest.approx(3 / 7)
    assert time_phase(np.array([0]), "hour_of_day")[0] == 0.0
    s = MONDAY + np.array([0, 5 * H + 17, 3 * 86_400 + 123])
    for unit, per_s in (("ms", 1000), ("us", 10**6)):  # KuaiRand's ts is milliseconds
        np.testing.assert_array_equal(time_feature_values(s * per_s, ("hour_of_day", "day_of_week"), unit),
                                      time_feature_values(s, ("hour_of_day", "day_of_week"), "s"))


def test_timestamps_before_the_epoch_wrap_into_the_cycle():
    p = time_phase(np.array([-H]), "hour_of_day")[0]
    assert p == pytest.approx(23 / 24)


# ----------------------------------------------------------------------------------------- schema
def test_schema_round_trips_and_declares_the_derived_inputs():
    s = tiny(["hour_of_day", "day_of_week"], "ms")
    assert s.time_features == ("hour_of_day", "day_of_week") and s.time_unit == "ms"
    assert FeatureSchema.from_dict(tomllib.loads(s.to_toml())) == s
    assert s.num_dense_inputs == len(s.dense) + 4
    assert s.dense_input_names == s.dense_names + ["hour_of_day_sin", "hour_of_day_cos",
                                                   "day_of_week_sin", "day_of_week_cos"]
    assert 'time_features = [\n    "hour_of_day",\n    "day_of_week",\n]' in s.to_toml()


def test_a_schema_without_the_key_has_no_time_features_and_serialises_as_before():
    s = tiny()
    assert s.time_features == () and s.num_dense_inputs == len(s.dense)
    text = s.to_toml()
    assert "time_features" not in text and "time_unit" not in text  # old files' digests stay valid
    assert FeatureSchema.from_dict(tomllib.loads(text)) == s


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.update(time_features=["hour"]),
     "time_features: 'hour' is not one of hour_of_day, day_of_week"),
    (lambda d: d.update(time_features=["hour_of_day", "hour_of_day"]), "time_features: duplicate"),
    (lambda d: d.update(time_features=[3]), "time_features: expected names, got 3"),
    (lambda d: d.update(time_features="hour_of_day"), "time_features: wrong type str"),
    (lambda d: d.update(time_unit="h"), "time_unit: 'h' is not one of s, ms, us"),
    (lambda d: d.update(time_features=["hour_of_day"],
                        dense=[*d["dense"], {"name": "hour_of_day_sin"}]),
     "duplicate name 'hour_of_day_sin'"),
])
def test_bad_time_features_are_one_schema_error_naming_the_value(mutate, needle):
    d = tomllib.loads(TINY.read_text())
    mutate(d)
    with pytest.raises(SchemaError, match=needle.replace("(", r"\(").replace("[", r"\[")) as e:
        FeatureSchema.from_dict(d, "s.toml")
    assert "\n" not in str(e.value)


def test_the_simulator_declares_a_feature_for_each_cycle_it_generates():
    assert sim_schema(SimConfig()).time_features == ("hour_of_day",)  # weekly_rate_amp = 0 by default
    assert sim_schema(SimConfig(weekly_rate_amp=0.1)).time_features == ("hour_of_day", "day_of_week")
    assert sim_schema(SimConfig(hour_rate_amp=0.0)).time_features == ()


# ----------------------------------------------------------------------------------------- encoding
@pytest.fixture(scope="module")
def sim_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("tf") / "data"
    simulate(SimConfig(rows=600, days=2, users=500, ads=200, advertisers=20, topics=10, seq_max=8,
                       seq_mean=3.0, emb_dim=4, chunk_rows=600, weekly_rate_amp=0.1), out)
    return out


def _columns(path: Path, schema: FeatureSchema) -> Columns:
    return Columns.from_arrow(pq.read_table(Dataset(path).files("@all")[0]), schema)


def test_to_batch_appends_the_pairs_after_the_dense_features(sim_data):
    with_tf = Dataset(sim_data).schema
    assert with_tf.time_features == ("hour_of_day", "day_of_week")
    without = dataclasses.replace(with_tf, time_features=())
    cols = _columns(sim_data, with_tf)
    a, b = to_batch(cols, with_tf), to_batch(cols, without)
    n = len(with_tf.dense)
    assert a.dense.shape == (cols.n, n + 4) and b.dense.shape == (cols.n, n)
    assert torch.equal(a.dense[:, :n], b.dense)
    assert torch.equal(a.ts, b.ts)
    want = time_feature_values(cols.scalars["ts"], ("hour_of_day", "day_of_week"))
    assert torch.equal(a.dense[:, n:], torch.from_numpy(want))
    # the simulator's own linear hour column agrees with the derived phase
    hod = with_tf.dense_names.index("hour_of_day")
    np.testing.assert_allclose(a.dense[:, hod].numpy(), time_phase(cols.scalars["ts"], "hour_of_day"),
                               atol=1e-6)


def test_a_schema_file_without_the_key_gives_the_batch_it_gave_before(sim_data, tmp_path):
    """An old dataset: its schema.toml has no time_features; its Batch is what the code before them built."""
    schema = Dataset(sim_data).schema
    d = schema.to_dict()
    del d["time_features"], d["time_unit"]
    old = tmp_path / "schema.toml"
    old.write_text(FeatureSchema.from_dict(d).to_toml())
    old_schema = FeatureSchema.load(old)
    assert old_schema.time_features == ()
    cols = _columns(sim_data, old_schema)
    batch = to_batch(cols, old_schema)
    before = np.stack([cols.scalars[f.name] for f in old_schema.dense], axis=1)  # the former to_batch
    assert torch.equal(batch.dense, torch.from_numpy(before))


def _predictor(schema: FeatureSchema) -> Predictor:
    torch.manual_seed(0)
    cfg = ModelConfig(name="dlrm")
    model = build_model(schema, cfg).eval()
    return Predictor(make_artifact(model, schema, cfg, "v0001", 99), backend="eager")


def test_loader_batch_equals_predictor_batch_with_time_features(sim_data, tmp_path):
    schema = Dataset(sim_data).schema
    table = pq.read_table(Dataset(sim_data).files("@all")[0])
    table = table.filter(pa.compute.equal(table["surface"], 1)).slice(0, 24)
    ts = int(table["ts"][5].as_py())
    table = table.set_column(table.schema.get_field_index("ts"), "ts", pa.array([ts] * table.num_rows))
    f = tmp_path / "rows.parquet"
    pq.write_table(table, f)
    loader_batch = next(iter(ParquetLoader([f], schema, 24, drop_last=False)))
    rows = table.to_pylist()
    p = _predictor(schema)
    req = {"surface": schema.surfaces[1], "ts": ts,
           "candidates": [{k: r[k] for k in schema.feature_columns()} for r in rows]}
    served, _ = p.encode([req])
    assert torch.equal(served.dense, loader_batch.dense) and torch.equal(served.ts, loader_batch.ts)
    with torch.no_grad():
        want = torch.sigmoid(p.model(loader_batch).logits)
    assert p.score(req)["scores"]["click"] == want[:, 0].tolist()


def test_a_request_without_ts_is_scored_at_the_servers_clock(sim_data, tmp_path):
    schema = Dataset(sim_data).schema
    table = pq.read_table(Dataset(sim_data).files("@all")[0]).slice(0, 3)
    cands = [{k: r[k] for k in schema.feature_columns()} for r in table.to_pylist()]
    p = _predictor(schema)
    import time

    before = int(time.time())
    served, _ = p.encode([{"surface": 0, "candidates": cands}])
    after = int(time.time())
    assert ((served.ts >= before) & (served.ts <= after)).all()
    n = len(schema.dense)
    want = time_feature_values(served.ts.numpy(), schema.time_features)
    assert torch.equal(served.dense[:, n:], torch.from_numpy(want))
    for bad in ("noon", 1.5, True):
        with pytest.raises(BadRequest, match="'ts' must be an integer time"):
            p.encode([{"surface": 0, "ts": bad, "candidates": cands}])


# ----------------------------------------------------------------------------------------- models
@pytest.mark.parametrize("name", [*MODEL_NAMES, "vm"])
def test_every_family_trains_on_a_batch_with_time_features(name):
    schema = tiny(["hour_of_day", "day_of_week"])
    torch.manual_seed(0)
    if name == "vm":
        vm_schema = derive_vm_schema(schema, VMSchemaConfig(vocab_cap=20), name="vm")
        assert vm_schema.time_features == schema.time_features
        model = VerticalModel(vm_schema, ModelConfig(name="dlrm"), aux_head=True)
        schema = vm_schema
    else:
        model = build_model(schema, ModelConfig(name=name))
    b = random_batch(schema, 6)
    assert b.dense.shape == (6, schema.num_dense_inputs)
    out = model(b)
    assert out.logits.shape == (6, 2) and torch.isfinite(out.logits).all()
    out.logits.sum().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)
    if name != "vm":
        # the FLOP count sees the wider input: the same model without time features counts fewer FLOPs
        # (LR sends dense inputs straight to its linear head: counted as 0 interaction FLOPs either way)
        fewer = build_model(tiny(), ModelConfig(name=name)).flops_per_example()
        assert model.flops_per_example() > fewer or name == "lr"


def test_a_model_refuses_a_batch_without_the_time_inputs():
    schema = tiny(["hour_of_day"])
    model = build_model(schema, ModelConfig(name="gem"))
    b = random_batch(tiny(), 4)  # the dense features only
    with pytest.raises(ValueError, match="hour_of_day_sin"):
        model(b)
