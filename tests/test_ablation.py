"""The ablation study (bench/ablation.py, bench/ablation_report.py): equal compute per configuration,
paired seeds, the sign and interval of ΔNE, and the proxy's rank agreement."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from opengem.bench.ablation import (
    FULL,
    AblationConfig,
    ProxyVariant,
    choose_rate,
    configurations,
    load_ablation_config,
    narrowed_d,
    proxy_steps,
    run_ablation,
    run_config,
)
from opengem.bench.ablation_report import (
    bootstrap_draws,
    format_ablation,
    one_seed_agreement,
    paired_delta,
    rank_agreement,
    row_ne,
    split_half,
    which_knob_breaks,
)
from opengem.config import ConfigError, load_config, save_config
from opengem.metrics import normalized_entropy

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "configs" / "ablation-small.toml"
BATCH = 64  # ablation-small's data.batch_size


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> tuple[AblationConfig, dict]:
    """The small study's plan on a sampled stream (no training): every configuration's FLOPs and rows."""
    cfg = load_ablation_config(SMALL, ["max_epochs=20"])  # a shrunk stream, read many times
    out = tmp_path_factory.mktemp("ablation-plan")
    return cfg, run_ablation(cfg, out, run_overrides=["data.sim.rows=4000"], plan_only=True, time_plan=False,
                             log=lambda m: None)


def test_every_configuration_gets_the_same_training_flops(planned):
    cfg, res = planned
    rows = {r["name"]: r for r in res["plan"]["configs"]}
    assert list(rows) == [FULL] + [a.name for a in cfg.ablations] and len(rows) >= 10
    for r in rows.values():  # rows = budget / (3 x own FLOPs), rounded to whole batches
        assert abs(r["train_flops"] - cfg.budget) <= 3 * r["fwd_flops"] * BATCH / 2, r
        assert r["examples"] == r["steps"] * BATCH
    # the ablations really change the model, so equal compute means different rows
    full = rows[FULL]["fwd_flops"]
    assert rows["no_cla"]["fwd_flops"] < full and rows["wukong_only"]["fwd_flops"] < full
    assert rows["d8"]["fwd_flops"] < full < rows["d24"]["fwd_flops"]
    assert rows["d8"]["examples"] > rows[FULL]["examples"] > rows["d24"]["examples"]
    assert "est s/run" in res["plan_text"] and "full" in res["plan_text"]


def test_proxy_arithmetic():
    v = ProxyVariant(name="p", rows_fraction=0.25, d_divisor=2, d_multiple=4)
    assert proxy_steps(71, v) == 18 and proxy_steps(2, v) == 1
    assert [narrowed_d(d, v) for d in (16, 24, 8, 4)] == [8, 12, 4, 4]


def test_a_width_proxy_that_narrows_nothing_is_refused(tmp_path):
    """d 16 // 2 at d_multiple 16 rounds back to 16: such a proxy would train the full width while its report
    called it narrower; it is refused before anything trains. d_multiple 8 narrows (to 8) and plans."""
    same = '[{name = "w", d_divisor = 2, d_multiple = 16, seeds = 1}]'
    cfg = load_ablation_config(SMALL, ["max_epochs=20", f"proxies={same}"])
    with pytest.raises(ConfigError, match=r"proxy 'w': .*embedding.d 16 // d_divisor 2 rounds back to 16"):
        run_ablation(cfg, tmp_path / "a", run_overrides=["data.sim.rows=4000"], plan_only=True,
                     time_plan=False, log=lambda m: None)
    cfg = load_ablation_config(SMALL, ["max_epochs=20", f"proxies={same.replace('16', '8')}"])
    res = run_ablation(cfg, tmp_path / "b", run_overrides=["data.sim.rows=4000"], plan_only=True,
                       time_plan=False, log=lambda m: None)
    assert [p["name"] for p in res["plan"]["proxies"]] == ["w"]


def test_seeds_pair_the_data_order_across_configurations(planned, tmp_path):
    """Seed s of every configuration (and of a proxy) reads the same training rows in the same order;
    another seed reads another order."""
    from opengem.bench.ablation import as_isoflop
    from opengem.bench.isoflop import prepare_study
    from opengem.data.dataset import Dataset
    from opengem.train.data import make_loader

    cfg, _ = planned
    st = prepare_study(as_isoflop(cfg), tmp_path, None, ["data.sim.rows=4000"], lambda m: None,
                       plan_only=True)
    fams = {f.name: f for f in configurations(cfg)}
    ds = Dataset(st.data)

    def first_ids(name: str, seed: int, variant: ProxyVariant | None = None) -> list[int]:
        rc = run_config(st, fams[name], 10, 1e-3, seed, variant)
        assert rc.train.seed == seed and rc.train.lr == 1e-3
        batches = iter(make_loader(ds, rc.data.train, rc.data, train=True, seed=rc.train.seed))
        return [int(i) for _ in range(3) for i in next(batches).example_id]

    a = first_ids(FULL, 3)
    assert first_ids("no_cla", 3) == a and first_ids("d24", 3) == a
    assert first_ids("shared_head", 3, ProxyVariant("p", rows_fraction=0.5, d_divisor=2)) == a
    assert first_ids(FULL, 4) != a


def test_train_window_latest_reads_the_newest_days_for_each_configuration(tmp_path):
    """train_window = latest (as the iso-FLOP study's): every configuration, and a proxy with its fewer rows,
    reads the newest whole training days that hold its own rows; the default reads every training day;
    latest_rows reads latest's days in order and drops the batches before its last ``steps``."""
    from opengem.bench.ablation import as_isoflop
    from opengem.bench.isoflop import prepare_study

    studies = {}
    for window in ("all", "latest", "latest_rows"):
        cfg = load_ablation_config(SMALL, ["max_epochs=20", f"train_window={window}"])
        assert as_isoflop(cfg).train_window == window
        studies[window] = prepare_study(as_isoflop(cfg), tmp_path / window, None, ["data.sim.rows=4000"],
                                        lambda m: None, plan_only=True)
    st = studies["latest"]
    fams = {f.name: f for f in configurations(cfg)}
    train = st.train_spec.split(",")
    newest = st.day_rows[-1][1]
    assert run_config(st, fams[FULL], 1, None, 0).data.train == train[-1]
    assert run_config(st, fams["d24"], newest // BATCH + 1, None, 0).data.train == ",".join(train[-2:])
    proxy = ProxyVariant("p", rows_fraction=0.25)
    steps = proxy_steps(4 * (newest // BATCH), proxy)  # a full run of ~4 days, its proxy: the newest
    assert run_config(st, fams[FULL], steps, None, 0, proxy).data.train == train[-1]
    assert run_config(studies["all"], fams[FULL], 1, None, 0).data.train == studies["all"].train_spec
    rows = run_config(studies["latest_rows"], fams[FULL], 3, None, 0)  # latest's day, in order, its end
    assert rows.data.train == train[-1] and not rows.data.shuffle
    assert rows.data.skip_batches == newest // BATCH - 3
    with pytest.raises(ConfigError, match="train_window"):
        load_ablation_config(SMALL, ["train_window=newest"])


def _fake_rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    p_true = rng.uniform(0.02, 0.3, n)
    return p_true, (rng.uniform(size=n) < p_true).astype(np.float64)


def _ll(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    return -(y * np.log(p) + (1 - y) * np.log(1 - p))


def test_row_ne_matches_the_metric_and_weights_repeat_rows():
    p, y = _fake_rows(500, 0)
    m = np.ones_like(y)
    assert row_ne(_ll(p, y), y, m)[0, 0] == pytest.approx(normalized_entropy(p, y), rel=1e-9)
    w = np.random.default_rng(1).integers(0, 3, size=(1, y.size)).astype(np.float64)
    rep = np.repeat(np.arange(y.size), w[0].astype(int))
    assert row_ne(_ll(p, y), y, m, w)[0, 0] == pytest.approx(normalized_entropy(p[rep], y[rep]), rel=1e-9)
    m[::2] = 0  # unobserved labels are left out of both the loss and the base rate
    keep = m > 0
    assert row_ne(_ll(p, y) * m, y * m, m)[0, 0] == pytest.approx(normalized_entropy(p[keep], y[keep]))


def test_delta_ne_sign_and_interval_on_a_constructed_case():
    """The full model predicts the true rate; the ablation predicts it blurred towards the mean: ΔNE =
    NE(ablation) - NE(full) is positive with an interval above 0, and the swap gives the mirror image."""
    n, seeds = 4000, 5
    p, y = _fake_rows(n, 2)
    m = np.ones(n)
    rng = np.random.default_rng(3)
    full = np.stack([_ll(np.clip(p * rng.lognormal(0, 0.05, n), 1e-3, 0.999), y) for _ in range(seeds)])
    blurred = np.clip(0.3 * p + 0.7 * p.mean(), 1e-3, 0.999)
    worse = np.stack([_ll(blurred, y) for _ in range(seeds)])
    w, draws = bootstrap_draws(n, seeds, 300, np.random.default_rng(0))
    point, samples = paired_delta(worse, full, y, m, w, draws)
    assert point > 0.01 and np.quantile(samples, 0.025) > 0
    assert point == pytest.approx(float(np.mean(row_ne(worse, y, m)[0] - row_ne(full, y, m)[0])))
    assert row_ne(worse, y, m)[0, 0] == pytest.approx(normalized_entropy(blurred, y), rel=1e-6)
    back, back_samples = paired_delta(full, worse, y, m, w, draws)
    assert back == pytest.approx(-point) and np.allclose(back_samples, -samples)
    # identical configurations: exactly zero, whatever the resample
    zero, z = paired_delta(full, full, y, m, w, draws)
    assert zero == 0 and np.all(z == 0)


def test_spearman_rank_agreement():
    rng = np.random.default_rng(0)
    full = {f"c{i}": [float(i), float(i)] for i in range(1, 6)}
    swapped = {"c1": [2.0], "c2": [1.0], "c3": [4.0], "c4": [3.0], "c5": [5.0]}
    ag = rank_agreement(full, swapped, 200, rng)
    assert ag["rho"] == pytest.approx(1 - 6 * 4 / (5 * 24))  # 0.8: two adjacent swaps
    assert ag["configs"] == 5 and ag["reaches_target"]
    assert rank_agreement(full, {k: [-v[0]] for k, v in full.items()}, 50, rng)["rho"] == pytest.approx(-1)
    same = rank_agreement(full, {k: [v[0] * 10] for k, v in full.items()}, 200, rng)
    assert same["rho"] == 1 and same["ci95"][0] == pytest.approx(1)  # no seed noise: every resample agrees
    noisy = {f"c{i}": [float(i), float(6 - i)] for i in range(1, 6)}  # the two seeds rank in opposite order
    assert split_half(noisy) == pytest.approx(-1)
    wide = rank_agreement(noisy, swapped, 300, rng)
    assert wide["ci95"][1] - wide["ci95"][0] > 0.5  # seed noise widens the interval


def test_one_seed_proxy_ranks_each_seed_against_the_others():
    rng = np.random.default_rng(0)
    # every seed ranks the five configurations alike: rho 1 whichever seed is held out, and in every resample
    same = {f"c{i}": [float(i), float(i) + 0.5, float(i) - 0.5] for i in range(1, 6)}
    got = one_seed_agreement(same, 200, rng)
    assert got["rho"] == pytest.approx(1) and got["ci95"][0] == pytest.approx(1)
    assert got["compute_fraction"] == pytest.approx(1 / 3) and got["reaches_target"] and got["seeds"] == 1
    # seed 2 reverses the order of seeds 0 and 1: held out, it gets -1 against their mean; seed 0 held out
    # gets the mean of seed 1 (same order) and seed 2 (reversed), a tie of every configuration: NaN, skipped
    mixed = {f"c{i}": [float(i), float(i), float(6 - i)] for i in range(1, 6)}
    assert one_seed_agreement(mixed, 10, rng)["rho"] == pytest.approx(-1)
    # held-out seed s is compared with the other seeds only: two seeds that disagree give -1, not a blend
    two = {f"c{i}": [float(i), float(6 - i)] for i in range(1, 6)}
    assert one_seed_agreement(two, 10, rng)["rho"] == pytest.approx(-1)
    one = one_seed_agreement({f"c{i}": [float(i)] for i in range(1, 6)}, 10, rng)
    assert one["rho"] != one["rho"] and not one["reaches_target"]  # one seed: nothing to hold out against


def test_which_knob_breaks_names_the_worse_single_knob():
    variants = [ProxyVariant("rows", rows_fraction=0.25), ProxyVariant("narrow", d_divisor=2),
                ProxyVariant("both", rows_fraction=0.25, d_divisor=2)]
    res = {"rows": {"rho": 0.7, "reaches_target": False}, "narrow": {"rho": 0.2, "reaches_target": False},
           "both": {"rho": 0.1, "reaches_target": False}}
    msg = which_knob_breaks(res, variants)
    assert "the width knob ('narrow')" in msg
    assert "split-half rho 0.61" in which_knob_breaks(res, variants, ceiling=0.61)
    assert "split-half" not in which_knob_breaks(res, variants, ceiling=0.95)
    res["rows"] = {"rho": 0.9, "reaches_target": True}
    assert "'rows' reaches" in which_knob_breaks(res, variants)


def test_config_roundtrip_and_refusals(tmp_path):
    default = load_ablation_config(ROOT / "configs" / "ablation.toml")
    assert len(default.ablations) + 1 >= 10 and default.seeds >= 5
    cfg = load_config(AblationConfig, SMALL)
    save_config(cfg, tmp_path / "a.toml")
    assert load_config(AblationConfig, tmp_path / "a.toml") == cfg
    for bad, what in ((["seeds=1"], "seeds"), (["budget=0"], "budget"),
                      (['ablations=[{name = "full", overrides = ["x=1"]}]'], "unique"),
                      (['proxies=[{name = "p"}]'], "not cheaper"), (["lr_extend=-1"], "lr_extend")):
        with pytest.raises(ConfigError, match=what):
            load_ablation_config(SMALL, bad)


def test_rate_walks_past_the_grid_edge_until_bracketed():
    """The grid trains as one batch; while its best is an edge, one rate beyond it at a time, at most
    ``extend``; a bracketed best, extend 0 or the recipe's rate add nothing."""
    def scorer(ne_of):
        calls = []

        def score(lrs):
            calls.append(list(lrs))
            return [ne_of(lr) for lr in lrs]
        return score, calls

    grid = [1e-3, 3e-3, 1e-2]
    valley = {1e-3: 0.80, 3e-3: 0.79, 1e-2: 0.78, 3e-2: 0.775, 1e-1: 0.99}.__getitem__
    score, calls = scorer(valley)
    lr, scores = choose_rate(grid, 2, score)
    assert lr == 3e-2 and calls == [grid, [3e-2], [1e-1]] and list(scores) == [*grid, 3e-2, 1e-1]
    score, calls = scorer(valley)
    assert choose_rate(grid, 1, score)[0] == 3e-2 and calls == [grid, [3e-2]]  # the cap, though unbracketed
    score, calls = scorer(valley)
    assert choose_rate(grid, 0, score) == (1e-2, dict(zip(grid, [0.80, 0.79, 0.78]))) and calls == [grid]
    score, calls = scorer({1e-3: 0.79, 3e-3: 0.78, 1e-2: 0.80}.__getitem__)
    assert choose_rate(grid, 2, score)[0] == 3e-3 and calls == [grid]  # bracketed: nothing more
    score, calls = scorer({3e-4: 0.77, 1e-3: 0.78, 3e-3: 0.79, 1e-2: 0.80, 1e-4: 0.9}.__getitem__)
    lr, scores = choose_rate(grid, 2, score)
    assert lr == 3e-4 and calls == [grid, [3e-4], [1e-4]] and list(scores) == [1e-4, 3e-4, *grid]
    score, calls = scorer(lambda lr: 0.8)
    assert choose_rate([], 2, score) == (None, {None: 0.8}) and calls == [[None]]
    score, calls = scorer({1e-3: 0.80, 3e-3: 0.79, 1e-2: float("nan")}.__getitem__)
    assert choose_rate(grid, 2, score)[0] == 3e-3 and calls == [grid]  # a diverged edge is not the best


def test_cli_refuses_a_bad_study_on_one_line(capsys):
    from cli_helpers import one_error_line, run_cli

    rc, err = run_cli(capsys, ["scale", "--design", "ablation", "--budget", "small", "--set", "seeds=1"])
    assert rc == 2 and "seeds" in one_error_line(err, "scale")


@pytest.mark.slow
def test_tiny_study_end_to_end_and_resume(tmp_path):
    """Two configurations, 2 seeds and one proxy on a shrunk stream: outputs written, ΔNE equals the runs'
    own test NE difference, and a second call trains nothing."""
    cfg = load_ablation_config(SMALL, ["budget=2e8", "seeds=2", "lr_grid=[]", "bootstrap=50", "min_steps=2"])
    cfg.ablations, cfg.proxies = cfg.ablations[:1], cfg.proxies[:1]
    cfg.proxies[0].seeds = 0  # = the study's 2 seeds
    extra = ["data.sim.rows=8000"]
    res = run_ablation(cfg, tmp_path, run_overrides=extra, log=lambda m: None)
    on_disk = json.loads((tmp_path / "ablation.json").read_text())
    assert (tmp_path / "ablation_runs.csv").stat().st_size > 0
    assert on_disk["runs"] == res["runs"] == 2 * 2 + 2 * 2
    full, abl = res["configs"]
    for task in ("all/click", "all/conversion"):
        lo, hi = abl["delta_ne"][task]["ci95"]
        assert lo <= abl["delta_ne"][task]["mean"] <= hi
    assert abl["delta_ne"]["tasks"]["mean"] == pytest.approx(abl["test_ne"] - full["test_ne"], abs=1e-5)
    assert set(res["proxies"]) == {cfg.proxies[0].name}
    again = run_ablation(cfg, tmp_path, run_overrides=extra, log=lambda m: None)
    assert again["runs_trained_now"] == 0 and again["configs"][1]["test_ne"] == abl["test_ne"]


def test_study_with_two_workers_matches_one_worker(tmp_path):
    """The same tiny study (full model + one ablation, 2 seeds, a proxy) trained in-process and two runs at a
    time in worker processes: the same runs in the same order, the same NE per run and the same ΔNE; the
    workers' logs kept; a rerun reuses every run."""
    import csv

    over = ["budget=2e8", "seeds=2", "lr_grid=[1e-3, 1e-2]", "bootstrap=20", "min_steps=2"]
    extra = ["data.sim.rows=8000"]
    results = {}
    for workers in (1, 2):
        cfg = load_ablation_config(SMALL, [*over, f"workers={workers}"])
        cfg.ablations, cfg.proxies = cfg.ablations[:1], cfg.proxies[:1]
        cfg.proxies[0].seeds = 1
        data = tmp_path / "w1" / "data" if workers == 2 else None
        results[workers] = run_ablation(cfg, tmp_path / f"w{workers}", data, run_overrides=extra,
                                        log=lambda m: None)
    a, b = results[1], results[2]
    assert a["runs"] == b["runs"] == b["runs_trained_now"] == 1 + 2 * 2 + 2
    ne_a, ne_b = [c["test_ne"] for c in a["configs"]], [c["test_ne"] for c in b["configs"]]
    assert ne_a == pytest.approx(ne_b, rel=1e-6)
    da, db = a["configs"][1]["delta_ne"]["tasks"]["mean"], b["configs"][1]["delta_ne"]["tasks"]["mean"]
    assert da == pytest.approx(db, rel=1e-5, abs=1e-7)

    def rows(d: Path) -> list[tuple[str, float]]:
        with open(d / "ablation_runs.csv") as f:
            return [(r["run"], float(r["valid_ne"])) for r in csv.DictReader(f)]

    ra, rb = rows(tmp_path / "w1"), rows(tmp_path / "w2")
    assert [n for n, _ in ra] == [n for n, _ in rb]
    assert [v for _, v in ra] == pytest.approx([v for _, v in rb], rel=1e-6)
    assert len(list((tmp_path / "w2" / "logs").glob("*.txt"))) == b["runs"]
    assert all((tmp_path / "w2" / "runs" / n / "predictions-test.parquet").exists() for n, _ in rb
               if not n.startswith("proxy-"))
    again = run_ablation(cfg, tmp_path / "w2", tmp_path / "w1" / "data", run_overrides=extra,
                         log=lambda m: None)
    assert again["runs_trained_now"] == 0


def test_workers_config_checked():
    with pytest.raises(ConfigError, match="workers"):
        load_ablation_config(SMALL, ["workers=0"])
    with pytest.raises(ConfigError, match="calibrate"):
        load_ablation_config(SMALL, ["calibrate=isotonic"])


def test_calibrated_study_reuses_its_runs_and_scores_test_through_the_fit(tmp_path):
    """A finished uncalibrated study asked again with calibrate = platt trains nothing, fits every run's
    calibration on its validation rows, and scores test through it: the metrics and the paired predictions
    (rewritten: they are older than the fit) agree, so ΔNE is the calibrated test NE difference."""
    over = ["budget=2e8", "seeds=2", "lr_grid=[]", "bootstrap=20", "min_steps=2"]
    extra = ["data.sim.rows=40000"]  # validation days with enough labels for some cells' fits
    res = {}
    for cal in ("none", "platt"):
        cfg = load_ablation_config(SMALL, [*over, f"calibrate={cal}"])
        cfg.ablations, cfg.proxies = cfg.ablations[:1], []
        res[cal] = run_ablation(cfg, tmp_path, run_overrides=extra, log=lambda m: None)
    raw, cal = res["none"], res["platt"]
    assert raw["runs_trained_now"] == 4 and cal["runs_trained_now"] == 0
    for name in ("full-s0-b0-lrrecipe-seed0", f"{cfg.ablations[0].name}-s0-b0-lrrecipe-seed1"):
        run = tmp_path / "runs" / name
        rec = json.loads((run / "result.json").read_text())
        assert rec["calibrate"] == "platt" and (run / "calibration.json").exists()
        fit = (run / "calibration.json").stat().st_mtime
        assert (run / "predictions-test.parquet").stat().st_mtime >= fit
    assert [c["test_ne"] for c in cal["configs"]] != [c["test_ne"] for c in raw["configs"]]
    full, abl = cal["configs"]
    assert abl["delta_ne"]["tasks"]["mean"] == pytest.approx(abl["test_ne"] - full["test_ne"], abs=1e-5)


def test_spread_study_pairs_the_rows_each_run_was_scored_on(tmp_path):
    """eval_sample = spread: each full run's test predictions are exactly the eval_rows rows its test was
    scored on (whole row groups spread over the day, not its first rows), so ΔNE is the difference of the
    runs' test NE on those rows; the report says which rows."""
    import pyarrow.parquet as pq

    from opengem.data.dataset import Dataset
    from opengem.train.data import make_loader

    over = ["budget=2e8", "seeds=2", "lr_grid=[]", "bootstrap=20", "min_steps=2", "calibrate=platt",
            "eval_rows=1024", "eval_sample=spread"]
    cfg = load_ablation_config(SMALL, over)
    cfg.ablations, cfg.proxies = cfg.ablations[:1], []
    extra = ["data.sim.rows=40000", "data.sim.chunk_rows=256", "data.eval_batch_size=512"]
    res = run_ablation(cfg, tmp_path, run_overrides=extra, log=lambda m: None)
    assert res["test_rows"] == 1024 and res["eval_sample"] == "spread"
    assert "(1024 rows, whole row groups spread over the day)" in format_ablation(res)
    full, abl = res["configs"]
    assert abl["delta_ne"]["tasks"]["mean"] == pytest.approx(abl["test_ne"] - full["test_ne"], abs=1e-5)
    run = tmp_path / "runs" / "full-s0-b0-lrrecipe-seed0"
    assert not (run / "predictions-test.parquet").exists()
    pred = pq.read_table(run / "predictions-test-spread1024.parquet")
    ds = Dataset(tmp_path / "data")
    rc = load_config_of(run)
    test = res["splits"]["test"]
    spread = [b.labels for b in make_loader(ds, test, rc.data, train=False, spread_rows=1024)]
    first = next(iter(make_loader(ds, test, rc.data, train=False))).labels
    got = np.nan_to_num(pred.column("click_label").to_numpy(zero_copy_only=False).astype(float))
    click = ds.schema.task_names.index("click")
    want = np.nan_to_num(np.concatenate([y[:, click].numpy() for y in spread]))
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got[:512], np.nan_to_num(first[:, click].numpy()))


def load_config_of(run: Path):
    from opengem.train.config import load_run_config

    return load_run_config(run / "config.toml")


def test_a_failed_worker_run_stops_the_stage(tmp_path, monkeypatch):
    """With workers: the first failed run is raised, and the stage's runs not yet started never start."""
    import threading
    import time

    import opengem.bench.ablation as ablation
    from opengem.errors import TrainError

    calls, lock = [], threading.Lock()

    def fake_worker(module, args, out, run_dir, study):
        with lock:
            calls.append(run_dir.name)
        if run_dir.name.endswith("lr0.001-seed0"):
            raise TrainError(f"ablation: run {run_dir.name} failed (exit 1)")
        time.sleep(0.5)
        raise TrainError(f"ablation: run {run_dir.name} failed (exit 1)")

    monkeypatch.setattr(ablation, "train_in_worker_process", fake_worker)
    grid = "lr_grid=[1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3, 7e-3, 8e-3]"
    cfg = load_ablation_config(SMALL, ["budget=2e8", "seeds=2", grid, "min_steps=2", "workers=2"])
    with pytest.raises(TrainError, match=r"lr0\.001-seed0"):
        run_ablation(cfg, tmp_path, run_overrides=["data.sim.rows=8000"], log=lambda m: None)
    assert 1 <= len(calls) <= 3 < 8, calls
