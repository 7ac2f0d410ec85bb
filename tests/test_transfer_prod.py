"""The production-like transfer regime (issue 15): the FM version schedule (published every K windows, used
with a lag), no leakage at every staleness level, validation windows kept out of the reported numbers, and
the claims configs/transfer-prod*.toml make about rows, FLOPs and drift."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from opengem.config import ConfigError
from opengem.data.dataset import Dataset
from opengem.data.sim_config import SimConfig, sim_schema
from opengem.data.sim_core import surface_params
from opengem.data.simulate import simulate
from opengem.errors import TrainError
from opengem.model.registry import build_model
from opengem.train.config import RunConfig
from opengem.transfer import versions as versions_mod
from opengem.transfer.aggregate import aggregate, calibration_table, select_rows
from opengem.transfer.experiment import reported_rows
from opengem.transfer.experiment_config import ExperimentConfig, load_experiment_config
from opengem.transfer.tuning import choose, kd_grid_ne
from opengem.transfer.vertical import derive_vm_schema
from opengem.transfer.windows import (
    published_versions,
    train_published_versions,
    version_for_window,
    vm_start_window,
)

SWEEP = [0, 1, 2, 4, 8]


@pytest.fixture
def no_fm_training(monkeypatch):
    """train_fm_versions without the training: the run folder only (the schedule is what is tested)."""

    def fake_train(cfg, run_dir, data_dir=None, **kw):
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        return {}

    monkeypatch.setattr(versions_mod, "train", fake_train)


@pytest.fixture(scope="module")
def stream(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prod") / "data"
    simulate(SimConfig(rows=29 * 40, days=29, users=200, ads=200, advertisers=20, topics=20, seq_mean=4.0,
                       seq_max=8, chunk_rows=40, ad_lifetime_days=3.0), out)
    return out


@pytest.mark.parametrize("every", [1, 2, 3])
def test_an_example_only_sees_versions_trained_strictly_before_it_at_every_lag(stream, tmp_path, every,
                                                                             no_fm_training):
    ds = Dataset(stream)
    parts = ds.partitions()
    cfg = ExperimentConfig(publish_every=every, lag=1, staleness=SWEEP)
    start = vm_start_window(cfg, SWEEP, len(parts))
    vers = train_published_versions(RunConfig(), stream, tmp_path / "fm", parts, every)
    assert [v.version for v in vers] == published_versions(len(parts), every)
    tt = np.array([v.trained_through_ts for v in vers])
    for w in range(start, len(parts)):
        files = ds.files(parts[w])
        ts = np.concatenate([pq.read_table(f, columns=["ts"]).column(0).to_numpy() for f in files])
        for lag in SWEEP:
            idx = versions_mod.select_versions(tt, ts, lag)
            assert (idx >= 0).all(), f"window {w} lag {lag}: an example without a version"
            assert (tt[idx] < ts).all(), f"window {w} lag {lag}: a version trained on or after its example"
            used = {vers[i].version for i in idx}
            # every version used was trained on windows before w only, and is the scheduled one
            assert all(parts.index(p) < w for i in idx for p in vers[i].partitions)
            assert used == {version_for_window(w, every, lag)}, (w, lag, used)


def test_publishing_every_k_windows_steps_staleness_by_k():
    assert published_versions(10, 3) == [3, 6, 9]
    assert [version_for_window(w, 2, 0) for w in range(2, 8)] == [2, 2, 4, 4, 6, 6]
    assert [version_for_window(w, 2, 1) for w in range(4, 8)] == [2, 2, 4, 4]
    assert vm_start_window(ExperimentConfig(publish_every=2, lag=1, staleness=SWEEP), SWEEP, 40) == 18
    assert vm_start_window(ExperimentConfig(publish_every=2, lag=1, staleness=[], vm_first_window=12),
                           [1], 40) == 12


def test_too_few_windows_for_the_schedule_is_a_config_error_naming_the_knobs():
    cfg = ExperimentConfig(publish_every=2, lag=1, staleness=SWEEP, validation_windows=1)
    with pytest.raises(ConfigError, match="publish_every 2 .* needs 21"):
        vm_start_window(cfg, SWEEP, 20)


def test_a_run_folder_with_versions_off_the_schedule_is_refused(stream, tmp_path, no_fm_training):
    parts = Dataset(stream).partitions()[:6]
    train_published_versions(RunConfig(), stream, tmp_path / "fm", parts, 1)
    with pytest.raises(ConfigError, match="outside this publish_every=2 schedule"):
        train_published_versions(RunConfig(), stream, tmp_path / "fm", parts, 2)


@pytest.mark.parametrize("bad", [dict(publish_every=0), dict(vm_first_window=-1),
                                 dict(validation_windows=-2)])
def test_bad_schedule_knobs_are_refused(bad):
    with pytest.raises(ConfigError, match=next(iter(bad))):
        ExperimentConfig(**bad).validate()


def fake_seed(rng: np.random.Generator, ids: np.ndarray) -> dict:
    n = len(ids)
    y = (rng.random((n, 1)) < 0.3).astype(np.float32)

    def arm(noise: float) -> dict:
        return {"example_id": ids, "surface": np.zeros(n, np.int32), "logits": (y - 0.5) * 2
                + noise * rng.standard_normal((n, 1)), "labels": y, "mask": np.ones((n, 1), bool),
                "serving_flops": 100}

    res = {"surface": 0, "tasks": ["click"], "baseline": arm(3.0), "kd": arm(2.0),
           "kd_grid": {(1.0, 1.0): arm(2.0)}}
    res["fm"] = {"example_id": ids, "logits": arm(1.0)["logits"], "available": np.ones((n, 1), bool)}
    return {"feed": res}


def test_validation_rows_never_reach_the_reported_numbers():
    rng = np.random.default_rng(0)
    ids = np.arange(1000)
    seed = fake_seed(rng, rng.permutation(ids))
    val = np.arange(300)
    cfg = ExperimentConfig(validation_windows=1, bootstrap=20)
    (rep,) = reported_rows([seed], [val], cfg)
    for part in (rep["feed"]["baseline"], rep["feed"]["kd_grid"][(1.0, 1.0)], rep["feed"]["fm"]):
        assert set(part["example_id"].tolist()) == set(range(300, 1000))
        assert all(len(v) == 700 for v in part.values() if isinstance(v, np.ndarray))
    v = select_rows(seed, val)
    assert set(v["feed"]["kd"]["example_id"].tolist()) == set(range(300))
    a_rep, a_val = aggregate([rep], ["baseline", "kd"], cfg), aggregate([v], ["baseline", "kd"], cfg)
    assert a_rep["arms"]["kd"]["feed/click"]["rows"] == 700
    assert a_val["arms"]["kd"]["feed/click"]["rows"] == 300
    assert reported_rows([seed], [val], ExperimentConfig())[0] is seed  # no validation windows: unchanged


def test_calibration_reports_tr_per_seed_with_a_ci_that_narrows_with_rows():
    """The band must hold on every calibration seed, and TR must be resolved by the validation rows: the
    table carries each seed's TR and a paired bootstrap CI over rows, which shrinks as rows grow."""
    cfg = ExperimentConfig(validation_windows=1, bootstrap=100, seeds=[100, 101, 102])

    def table(n: int) -> dict:
        rng = np.random.default_rng(1)
        return calibration_table([fake_seed(rng, np.arange(n)) for _ in cfg.seeds], cfg)["feed/click"]

    small, big = table(500), table(8000)
    for m in (small, big):
        assert [ps["seed"] for ps in m["per_seed"]] == [100, 101, 102]
        lo, hi = m["kd_tr_ci"]
        assert lo < m["kd_tr"] < hi
        for ps in m["per_seed"]:
            assert ps["kd_tr_ci"][0] < ps["kd_tr"] < ps["kd_tr_ci"][1] and "per_seed" not in ps
    assert big["rows"] == 3 * 8000 and big["per_seed"][0]["rows"] == 8000
    width = lambda m: m["kd_tr_ci"][1] - m["kd_tr_ci"][0]  # noqa: E731
    assert width(big) < 0.5 * width(small)
    assert "per_seed" not in calibration_table([fake_seed(np.random.default_rng(0), np.arange(300))],
                                               ExperimentConfig(seeds=[100]))["feed/click"]


def test_kd_tuning_keeps_every_grid_points_ne_and_picks_the_lowest():
    """transfer.json shows the whole KD grid (round 3's tuned weight sat at the grid's edge unnoticed):
    every point's NE in grid order, the tuned point its minimum; a grid with nothing to score is refused."""
    rng = np.random.default_rng(0)
    seed = fake_seed(rng, np.arange(2000))
    y, res = seed["feed"]["baseline"]["labels"], seed["feed"]
    grid = [[1.0, 1.0], [2.0, 1.0], [4.0, 1.0], [8.0, 2.0]]
    for g, noise in zip(grid, (3.0, 0.5, 1.5, 6.0)):
        logits = (y - 0.5) * 2 + noise * rng.standard_normal(y.shape)
        res["kd_grid"][tuple(g)] = {**res["kd"], "logits": logits}
    scored = kd_grid_ne(seed, grid)
    assert [p["point"] for p in scored] == grid
    nes = [p["ne"] for p in scored]
    assert nes[1] < nes[2] < nes[0] < nes[3]

    def tune_kd(grid_ne: list[dict]) -> list[float]:  # the shared choice at one training length
        return choose([{**p, "epochs": 1} for p in grid_ne], ["feed"], False, "kd.grid")["feed"]["point"]

    assert tune_kd(scored) == [2.0, 1.0]
    for run in res["kd_grid"].values():
        run["labels"] = np.zeros_like(run["labels"])  # one class only: NE undefined everywhere
    unscorable = kd_grid_ne(seed, grid)
    assert all(np.isnan(p["ne"]) for p in unscorable)
    with pytest.raises(TrainError, match="kd.grid"):
        tune_kd(unscorable)


@pytest.mark.parametrize("path", ["configs/transfer-prod.toml", "configs/transfer-prod-small.toml"])
def test_prod_configs_state_a_production_like_regime(path):
    cfg = load_experiment_config(path)
    sim = SimConfig.from_dict(cfg.data.sim)
    assert not cfg.surface_bias, "no hand-added offset to FM logits: drift comes from the simulator"
    assert sim.ad_lifetime_days > 0 and sim.new_advertiser_frac > 0 and sim.interest_period_days > 0
    assert sim.drift_rad_per_day > 0 and sim.traffic_cycle_amp > 0 and sim.surface_signal_contrast > 0
    # FM versions arrive late: published every K windows (K = 1 since calibration round 9) and used >= 1
    # publication behind the freshest one allowed
    assert cfg.publish_every >= 1 and cfg.lag >= 1 and cfg.validation_windows >= 1
    lags = sorted({cfg.lag, *cfg.staleness})
    start = vm_start_window(cfg, lags, sim.days)
    # serving budget: the VM within 1/50 of the FM's FLOPs per example
    schema = sim_schema(sim)
    fm = build_model(schema, cfg.fm.model).flops_per_example()
    vm = build_model(derive_vm_schema(schema, cfg.vm.schema), cfg.vm.model).flops_per_example()
    assert fm >= 50 * vm, (fm, vm)
    assert cfg.vm.schema.max_len * 4 <= sim.seq_max, "the VM reads a short history, the FM a long one"
    # rows: at every reported window the FM version in use trained on >= 10x the VM's rows (expected
    # counts: rows spread evenly over days, surfaces by their traffic share)
    share = surface_params(sim.surfaces)[:, 0]
    per_day = sim.rows / sim.days
    for sname in cfg.surfaces:
        s = schema.surfaces.index(sname)
        for w in range(start + 1 + cfg.validation_windows, sim.days):
            fm_rows = version_for_window(w, cfg.publish_every, cfg.lag) * per_day
            vm_rows = (w - start) * per_day * share[s]
            assert fm_rows >= 10 * vm_rows, (path, sname, w, fm_rows, vm_rows)
    if path.endswith("transfer-prod.toml"):
        assert cfg.staleness == SWEEP and len(cfg.seeds) >= 5


@pytest.mark.slow
def test_transfer_prod_small_runs_end_to_end_through_the_cli(tmp_path):
    """The regime's config through `opengem transfer`, shrunk by overrides only (about a minute)."""
    import json

    from opengem import cli

    overrides = ["data.sim.rows=4000", "data.sim.days=8", "data.sim.users=300", "data.sim.ads=400",
                 "data.sim.chunk_rows=500", "data.sim.seq_max=16", "data.sim.seq_mean=8.0",
                 "vm_first_window=5", "validation_windows=1", "seeds=[100]", "fm.train.epochs=1",
                 "publish_every=2", "staleness=[0, 1]", 'surfaces=["feed"]', "kd.grid=[[1.0, 1.0]]",
                 "fm.model.gem.sequence.window=8", "fm.model.gem.sequence.chunk=8", "bootstrap=20",
                 "tune_seeds=1", "tune_epochs=[1]"]
    rc = cli.main(["transfer", "--config", "configs/transfer-prod-small.toml", "--out", str(tmp_path),
                   *overrides])
    assert rc == 0
    res = json.loads((tmp_path / "transfer.json").read_text())
    assert res["windows"]["validation"] == ["day=006"] and res["windows"]["eval"] == ["day=007"]
    assert set(res["calibration"]) == {"feed/click"} and res["calibration"]["feed/click"]["kd_tr"] is not None
    assert [p["point"] for p in res["kd_tuned"]["grid_ne"]] == [[1.0, 1.0]]
    reg = res["regime"]["surfaces"]["feed"]
    assert res["regime"]["vm_start"] == 5 and reg["windows"][0]["fm_version"] == 4  # window 7: (7//2 - 1) * 2
    assert reg["vm_flops_per_example"] == res["serving_flops"]["baseline"]["serving_flops_per_example"]
    assert reg["fm_over_vm_flops"] == res["regime"]["fm_flops_per_example"] / reg["vm_flops_per_example"] > 10
    assert set(res["staleness"]) == {"0", "1"}
    assert sorted(p.name for p in (tmp_path / "seed100" / "fm" / "versions").iterdir()) == ["v0002", "v0004",
                                                                                            "v0006"]
    v4 = json.loads((tmp_path / "seed100" / "fm" / "versions" / "v0004" / "manifest.json").read_text())
    assert v4["mode"] == "warm" and v4["init_from"] == 2 and v4["new_partitions"] == ["day=002", "day=003"]
