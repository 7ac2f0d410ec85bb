import math
from pathlib import Path

import numpy as np
import pytest

from opengem.bench.fit import PowerLaw, efficiency_ratios, fit_power_law, rankdata, spearman
from opengem.bench.scale import FamilySweep, load_sweep_config, run_sweep, size_overrides, summarize
from opengem.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
TINY_SWEEP = ROOT / "configs" / "scaling-tiny.toml"


def test_power_law_recovers_known_parameters():
    x = np.geomspace(1e9, 1e13, 7)
    y = 3.0 * x**-0.25 + 0.62
    f = fit_power_law(x, y, c_min=0.5)
    assert f.a == pytest.approx(3.0, rel=1e-4) and f.b == pytest.approx(0.25, rel=1e-4)
    assert f.c == pytest.approx(0.62, abs=1e-6) and f.rmse < 1e-9
    noisy = y + np.random.default_rng(0).normal(0, 2e-5, y.size)
    g = fit_power_law(x, noisy, c_min=0.5)
    assert g.b == pytest.approx(0.25, rel=0.05) and g.c == pytest.approx(0.62, abs=2e-3)


def test_power_law_fixed_floor_is_loglinear():
    x = np.array([1.0, 10.0, 100.0])
    f = fit_power_law(x, 2 * x**-0.5 + 0.3, c=0.3)
    assert (f.a, f.b, f.c_fixed) == (pytest.approx(2.0), pytest.approx(0.5), True)
    with pytest.raises(ValueError, match="exceed"):
        fit_power_law(x, 2 * x**-0.5 + 0.3, c=0.5)
    with pytest.raises(ValueError, match="need >= 3"):
        fit_power_law(x[:2], x[:2])


def test_c_respects_the_floor():
    x = np.geomspace(1, 1000, 5)
    y = x**-0.3 + 0.2
    f = fit_power_law(x, y, c_min=0.25)  # a floor above the true asymptote binds
    assert f.c >= 0.25 - 1e-12 and f.c < y.min()
    assert fit_power_law(x, y, c_min=0.0).c == pytest.approx(0.2, abs=1e-6)


def test_inverse_and_efficiency_ratio_on_shifted_curves():
    ref = PowerLaw(a=1.0, b=0.2, c=0.5, rmse=0, n=5)
    # the other family needs exactly 4x the compute for any NE: other(x) = ref(x / 4)
    other = PowerLaw(a=1.0 * 4**0.2, b=0.2, c=0.5, rmse=0, n=5)
    assert other(4e9) == pytest.approx(ref(1e9))
    assert ref.inverse(float(ref(123.0))) == pytest.approx(123.0)
    rows = efficiency_ratios(ref, [1e9, 1e10, 1e11], other, (1e9, 1e11))
    assert [r["ratio"] for r in rows] == [pytest.approx(4.0)] * 3
    assert [r["extrapolated"] for r in rows] == [False, False, True]  # 4e11 is past the measured 1e11
    # fitted from points rather than given: the same answer
    xs = np.geomspace(1e9, 1e12, 6)
    fr, fo = fit_power_law(xs, ref(xs), c_min=0.4), fit_power_law(xs, other(xs), c_min=0.4)
    assert efficiency_ratios(fr, [1e10], fo, (1e9, 1e12))[0]["ratio"] == pytest.approx(4.0, rel=1e-3)
    assert PowerLaw(a=1.0, b=0.001, c=0.5, rmse=0, n=4).inverse(0.5 + 1e-3) == math.inf  # 10^3000: overflow


def test_efficiency_unreachable_and_non_decreasing():
    ref = PowerLaw(1.0, 0.2, 0.5, 0, 5)
    worse = PowerLaw(1.0, 0.2, 0.9, 0, 5)  # asymptote above ref's NE at large compute
    r = efficiency_ratios(ref, [1e12], worse, (1, 1e13))[0]
    assert r["reachable"] is False and r["ratio"] is None and math.isinf(worse.inverse(0.6))
    up = PowerLaw(1.0, -0.1, 0.5, 0, 5)
    assert efficiency_ratios(ref, [1e3], up, (1, 10))[0]["ratio"] is None
    with pytest.raises(ValueError):
        up.inverse(0.7)


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert list(rankdata([5, 1, 5, 2])) == [3.5, 1.0, 3.5, 2.0]
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_size_overrides_grid_and_nested_sizes():
    f = FamilySweep(name="x", grid={"model.dlrm.top_mlp": [[8], [16]], "model.embedding.d": [4, 8]},
                    sizes=[{"model": {"embedding": {"d": 2}}}])
    s = size_overrides(f)
    assert s[0] == ["model.embedding.d=2"]
    assert len(s) == 5 and ["model.dlrm.top_mlp=[16]", "model.embedding.d=8"] in s


def test_sweep_config_errors(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text(f'base = "{ROOT / "configs" / "tiny.toml"}"\nbogus = 1\n')
    with pytest.raises(ConfigError, match="bogus"):
        load_sweep_config(p)
    p.write_text(f'base = "{ROOT / "configs" / "tiny.toml"}"\n')
    with pytest.raises(ConfigError, match="families"):
        load_sweep_config(p)
    p.write_text('base = "nope.toml"\n[[families]]\nname = "gem"\nsizes = [{ "model.embedding.d" = 8 }]\n')
    with pytest.raises(ConfigError, match="not found"):
        load_sweep_config(p)


def test_summarize_on_synthetic_rows():
    from opengem.bench.scale import SweepConfig

    rows = []
    for fam, shift in (("gem", 1.0), ("dlrm", 8.0)):
        for i, c in enumerate(np.geomspace(1e9, 1e11, 5)):
            rows.append({"name": f"{fam}-{i}", "family": fam, "proxy": False, "train_flops": c,
                         "dense_params": 1000 * (i + 1), "ne": float(0.9 * (c / shift) ** -0.1 + 0.7),
                         "oracle_ne": 0.65, "train_examples": 100})
    res = summarize(SweepConfig(families=[FamilySweep(name="gem", sizes=[{}])]), rows, None, [])
    assert res["fits"]["gem"]["b"] == pytest.approx(0.1, rel=1e-3)
    assert [r["ratio"] for r in res["efficiency"]["dlrm"]] == [pytest.approx(8.0, rel=1e-3)] * 5
    m = res["ne_at_matched_compute"]["dlrm"]
    assert m[0]["ne_other"] == pytest.approx(0.9 * (1e9 / 8) ** -0.1 + 0.7) and m[0]["delta"] > 0


def _check_outputs(out: Path, families: set[str]) -> None:
    import csv
    import json

    for f in ("scaling.csv", "fits.json", "scaling.png", "sweep.toml"):
        assert (out / f).stat().st_size > 0, f
    rows = list(csv.DictReader(open(out / "scaling.csv")))
    assert {r["family"] for r in rows} == families
    assert all(float(r["train_flops"]) > 0 and 0 < float(r["ne"]) < 50 for r in rows)
    fits = json.loads((out / "fits.json").read_text())
    assert fits["oracle_ne"] is not None and 0 < fits["oracle_ne"] < 1
    assert load_sweep_config(out / "sweep.toml").families  # the resolved sweep reloads


def test_scale_fast_end_to_end(tmp_path):
    """Two families x two sizes on a shrunk tiny stream, log-linear fit on the oracle floor."""
    sweep = load_sweep_config(TINY_SWEEP, ["proxy.enabled=false", "fit=floor"])
    sweep.families = [FamilySweep(name="gem", sizes=[{"model.embedding.d": 8}, {"model.embedding.d": 16}]),
                      FamilySweep(name="dlrm", grid={"model.dlrm.top_mlp": [[16], [64, 32]]})]
    res = run_sweep(sweep, tmp_path, run_overrides=["data.sim.rows=1200", "data.batch_size=64"],
                    log=lambda m: None)
    _check_outputs(tmp_path, {"gem", "dlrm"})
    assert res["fit_form"] == "floor"


def test_a_sweep_keeps_what_it_wrote(tmp_path, monkeypatch, capsys):
    """sweep.toml is written with the results and re-runs them (the command line's run overrides
    included); a re-run with another simulator config is refused before anything moves (OUT/data is read
    by every run beside it; it was deleted and simulated anew); an unreadable result.json is said and
    that run trained again instead of failing the study."""
    import json

    import opengem.train.trainer as trainer
    from opengem.errors import UsageError

    sweep = load_sweep_config(TINY_SWEEP, ["proxy.enabled=false", "fit=floor"])
    sweep.families = [FamilySweep(name="gem", sizes=[{"model.embedding.d": 8}])]
    sweep.reference = "gem"
    extra = ["data.sim.rows=1200", "data.batch_size=64"]
    run_sweep(sweep, tmp_path, run_overrides=extra, log=lambda m: None)
    saved = load_sweep_config(tmp_path / "sweep.toml")
    assert saved.overrides[-2:] == extra
    summary = (tmp_path / "data" / "summary.json").read_text()
    with pytest.raises(UsageError, match=r"data: holds data simulated with another simulator config "
                                         r"\(rows 1200 -> 1300\)"):
        run_sweep(sweep, tmp_path, run_overrides=["data.sim.rows=1300", "data.batch_size=64"],
                  log=lambda m: None)
    assert (tmp_path / "data" / "summary.json").read_text() == summary
    assert not list((tmp_path / "runs").glob("*.old-*"))
    run = tmp_path / "runs" / "gem-00"
    (run / "result.json").write_text((run / "result.json").read_text()[:40])
    trained = []
    real_train = trainer.train
    monkeypatch.setattr(trainer, "train", lambda cfg, run_dir, **kw: trained.append(run_dir) or
                        real_train(cfg, run_dir, **kw))
    run_sweep(sweep, tmp_path, run_overrides=extra, log=lambda m: None)
    assert trained == [run] and "gem-00/result.json: unreadable" in capsys.readouterr().err
    assert json.loads((run / "result.json").read_text())["summary"]


def test_a_sweep_names_a_reference_or_metric_it_does_not_have(tmp_path):
    for override, why in (("reference=foo", "reference = 'foo' is not one of the families"),
                          ("metric=bogus", "metric must be surface_task, tasks or one NE key")):
        with pytest.raises(ConfigError, match=why):
            load_sweep_config(TINY_SWEEP, [override])
    load_sweep_config(TINY_SWEEP, ["metric=all/click"])


def _as_written_before_a_knob(runs: list) -> None:
    """Make finished runs look written by older code that lacked a knob: another hash (it covers every
    field) and a config.toml without the knob (which reads as its default)."""
    import json

    for run in runs:
        rec = json.loads((run / "result.json").read_text())
        (run / "result.json").write_text(json.dumps({**rec, "config_sha256": "written-by-older-code"}))
        text = (run / "config.toml").read_text()
        assert 'cross_sequence = "none"\n' in text
        (run / "config.toml").write_text(text.replace('cross_sequence = "none"\n', ""))


def test_scale_reuses_runs_written_before_a_knob_was_added(tmp_path, monkeypatch):
    """A finished run is reused when its config is the same, also when it was written by older code that
    lacked a knob (its hash differs; its config.toml, read today, is the same); a run whose written config
    differs in a value is trained again."""

    import opengem.train.trainer as trainer

    sweep = load_sweep_config(TINY_SWEEP, ["proxy.enabled=false", "fit=floor"])
    sweep.families = [FamilySweep(name="gem", sizes=[{"model.embedding.d": 8}, {"model.embedding.d": 16}])]
    extra = ["data.sim.rows=1200", "data.batch_size=64"]
    run_sweep(sweep, tmp_path, run_overrides=extra, log=lambda m: None)
    table = (tmp_path / "scaling.csv").read_text()
    runs = sorted(p.parent for p in tmp_path.rglob("result.json"))
    assert len(runs) == 2
    _as_written_before_a_knob(runs)
    trained = []
    real_train = trainer.train
    monkeypatch.setattr(trainer, "train", lambda cfg, run_dir, **kw: trained.append(run_dir) or
                        real_train(cfg, run_dir, **kw))
    run_sweep(sweep, tmp_path, run_overrides=extra, log=lambda m: None)
    assert trained == [] and (tmp_path / "scaling.csv").read_text() == table
    text = (runs[0] / "config.toml").read_text()
    (runs[0] / "config.toml").write_text(text.replace("sparse_lr = ", "sparse_lr = 0.5 #", 1))
    run_sweep(sweep, tmp_path, run_overrides=extra, log=lambda m: None)
    assert trained == [runs[0]]


@pytest.mark.slow
def test_scale_tiny_sweep_end_to_end(tmp_path):
    from opengem.cli import main

    assert main(["scale", "--config", str(TINY_SWEEP), "--out", str(tmp_path)]) == 0
    _check_outputs(tmp_path, {"gem", "dlrm", "dcnv2"})
    import json

    fits = json.loads((tmp_path / "fits.json").read_text())
    assert fits["proxy"]["n"] == 9 and -1 <= fits["proxy"]["spearman"] <= 1


# --------------------------------------------------------------------------- iso-FLOP study
ISO_SMALL = ROOT / "configs" / "isoflop-small.toml"


def test_isoflop_plan_arithmetic():
    from opengem.bench.isoflop import format_plan, plan_grid, rows_for_budget

    assert rows_for_budget(3e9, 1_000_000, 100) == (10, 1000)  # rows = C / (3 x fwd) = 1000
    assert rows_for_budget(3.2e9, 1_000_000, 100) == (11, 1100)  # 1067 rows: rounded to whole batches
    assert rows_for_budget(1e3, 1_000_000, 64) == (1, 64)  # at least one batch
    fwd = {"a": [100_000, 200_000, 400_000], "b": [300_000, 600_000, 1_200_000]}
    plan = plan_grid([6e8, 6e9], fwd, {"a": 10, "b": 10}, train_rows=20_000, min_steps=1)
    assert len(plan) == 2 * 2 * 3
    for p in plan:
        assert abs(p.examples - p.flops_budget / (3 * p.fwd_flops)) <= 5  # within half a batch of C / 3f
        assert p.train_flops == 3 * p.fwd_flops * p.examples and p.epochs == p.examples / 20_000
    big = next(p for p in plan if (p.family, p.size, p.budget) == ("a", 0, 1))
    assert (big.steps, big.examples) == (2000, 20_000)  # 10x the budget buys 10x the rows
    assert next(p for p in plan if (p.family, p.size, p.budget) == ("b", 2, 0)).examples == 170
    assert "12 grid runs" in format_plan(plan, lrs=3, seeds=3)  # + 2 lr + 2 x 2 seeds per family = 24
    assert "about 24 runs" in format_plan(plan, lrs=3, seeds=3)
    assert "about 28 runs" in format_plan(plan, lrs=3, seeds=3, lr_budgets=2)  # the lr grid at both budgets
    assert "lr-transfer" in format_plan(plan, lrs=3, seeds=3)
    # lr_sizes = "each": the grid on all 3 rungs of both families at both budgets (2 more rates x 12 rungs)
    assert "about 44 runs" in format_plan(plan, lrs=3, seeds=3, lr_budgets=2, lr_each_size=True)
    assert "up to 24 rates beyond" in format_plan(plan, lrs=3, seeds=3, lr_budgets=2, lr_extend=2,
                                                  lr_each_size=True)
    quiet = format_plan(plan, lrs=3, seeds=3, lr_budgets=2, lr_check=False)
    assert "lr-transfer" not in quiet and "beyond" not in quiet
    assert "up to 8 rates beyond the grid's edges" in format_plan(plan, lrs=3, seeds=3, lr_budgets=2,
                                                                 lr_extend=2, lr_check=False)
    with pytest.raises(ConfigError, match="passes over"):
        plan_grid([6e8, 6e9], fwd, {"a": 10, "b": 10}, train_rows=10_000)
    with pytest.raises(ConfigError, match="min_steps"):
        plan_grid([6e8], fwd, {"a": 10, "b": 10}, train_rows=20_000, min_steps=50)


def test_mean_ci_and_percentile_interval():
    from opengem.bench.fit import mean_ci, percentile_interval, t975

    m, h = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and h == pytest.approx(4.303 * 1.0 / math.sqrt(3))
    assert math.isnan(mean_ci([1.0])[1]) and t975(100) == 1.96
    lo, hi = percentile_interval(list(range(1, 1001)))
    assert 20 <= lo <= 30 and 970 <= hi <= 980
    assert percentile_interval([1.0] * 90 + [math.inf] * 10)[1] == math.inf  # never reached: no upper end


def test_isoflop_efficiency_on_known_laws():
    from opengem.bench.isoflop_report import efficiency_ratio, fit_frontier

    cs = list(np.geomspace(1e9, 1e11, 4))
    gem = [0.9 * c**-0.1 + 0.7 for c in cs]
    base = [0.9 * (c / 4) ** -0.1 + 0.7 for c in cs]  # needs 4x the compute for any NE
    f = fit_frontier(cs, base, floor=0.6)
    assert f is not None
    for c, ne in zip(cs, gem):
        assert efficiency_ratio(f, ne, c) == pytest.approx(4.0, rel=2e-2)
    assert math.isinf(efficiency_ratio(PowerLaw(1.0, 0.2, 0.95, 0, 4), 0.9, 1e9))  # asymptote above
    assert math.isnan(efficiency_ratio(PowerLaw(1.0, -0.2, 0.5, 0, 4), 0.9, 1e9))  # rises with compute
    assert fit_frontier(cs[:2], base[:2], 0.6) is None


def test_isoflop_efficiency_table_brackets_the_known_ratio():
    """The table the study's report and the follow-up scripts share: the point ratio of a baseline that
    needs 4x the compute, an interval around it from the seeds' spread, and its width set by that spread."""
    from opengem.bench.isoflop_report import efficiency_table, fit_frontier, format_laws, frontier_laws

    cs = list(np.geomspace(1e9, 1e11, 4))
    rng = np.random.default_rng(1)

    def family(shift: float, sd: float) -> tuple[list[dict], list[list[float]]]:
        means = [0.9 * (c / shift) ** -0.1 + 0.7 for c in cs]
        seeds = [list(m + rng.normal(0.0, sd, 5)) for m in means]
        return [{"train_flops": c, "ne": float(np.mean(s))} for c, s in zip(cs, seeds)], seeds

    for sd in (1e-4, 2e-3):
        (g, gs), (b, bs) = family(1.0, sd), family(4.0, sd)
        frontier, seeds = {"gem": g, "dcnv2": b}, {"gem": gs, "dcnv2": bs}
        fits = {f: fit_frontier(cs, [p["ne"] for p in fr], 0.6) for f, fr in frontier.items()}
        rows = efficiency_table(frontier, seeds, fits, 0.6, "gem", 200)["dcnv2"]
        assert [r["budget"] for r in rows] == [0, 1, 2, 3]
        last = rows[-1]
        assert last["ratio"] == pytest.approx(4.0, rel=0.15 if sd > 1e-3 else 0.03)
        lo, hi = last["ci95"]
        assert lo <= last["ratio"] <= hi
        assert (hi - lo < 1.0) if sd < 1e-3 else (hi - lo > 0.3)
        assert efficiency_table(frontier, seeds, fits, 0.6, "gem", 200) == {"dcnv2": rows}  # seeded
        points = {f: [(c, n) for c, n in zip(cs, seeds[f])] for f in frontier}  # the scripts' form
        laws, table = frontier_laws(points, 0.6, "gem", 200)
        assert table == {"dcnv2": rows} and laws["dcnv2"].to_dict() == fits["dcnv2"].to_dict()
        text = format_laws(laws, table, "GEM", "1e11").splitlines()
        assert text[0].startswith("gem: law {") and len(text) == 3
        assert text[2] == (f"dcnv2 compute to reach GEM's 1e11 NE, over GEM's: {last['ratio']:.2f}x "
                           f"[{lo:.2f}, {hi:.2f}]")


def test_isoflop_tiny_study_end_to_end_and_resume(tmp_path):
    """One family, 2 sizes, 2 budgets, 2 seeds on a shrunk stream: rows = C / (3 x FLOPs), the best size
    chosen on validation, the extra seed at it, outputs written; a second call trains nothing."""
    import json

    from opengem.bench.isoflop import load_isoflop_config, run_study

    cfg = load_isoflop_config(ISO_SMALL, ["budgets=[1.0e8, 4.0e8]", "seeds=2", "lr_grid=[]", "lr_check=false",
                                          "bootstrap=20", "min_steps=2"], ["dlrm"])
    cfg.families[0].sizes = cfg.families[0].sizes[:2]
    extra = ["data.sim.rows=8000", "data.eval_batch_size=4096"]
    res = run_study(cfg, tmp_path, run_overrides=extra, log=lambda m: None)
    for f in ("isoflop.json", "isoflop_runs.csv", "isoflop.png", "isoflop.toml"):
        assert (tmp_path / f).stat().st_size > 0, f
    on_disk = json.loads((tmp_path / "isoflop.json").read_text())
    assert on_disk["train_rows"] == res["train_rows"] == 8000 * 6 // 8
    fr = res["frontier"]["dlrm"]
    assert len(fr) == 2 and all(p["seeds"] == 2 and len(p["ne_seeds"]) == 2 for p in fr)
    for b, p in enumerate(fr):
        curve = res["isoflop_curves"]["dlrm"][b]
        assert [q["size"] for q in curve] == [0, 1]
        assert p["size"] == min(curve, key=lambda q: q["valid_ne"])["size"]  # chosen on validation
        for q in curve:
            assert abs(q["examples"] - cfg.budgets[b] / (3 * q["fwd_flops"])) <= 64 / 2  # batch 64
        assert set(p["calibration"]["pooled"]) == {"all/click", "all/conversion"}
        assert p["calibration"]["cells"] and p["calibration"]["cell_range"][0] > 0
    assert res["lr"]["chosen"]["dlrm"] is None  # lr_grid = []: the recipe's rate
    assert res["runs_trained_now"] == res["runs"] == 2 * 2 + 2 * 1
    again = run_study(cfg, tmp_path, run_overrides=extra, log=lambda m: None)
    from opengem.bench.isoflop_report import json_safe

    assert again["runs_trained_now"] == 0 and json_safe(again["frontier"]) == json_safe(res["frontier"])
    # results written by older code, which had fewer knobs: their hash differs (it covers every field) and
    # their config.toml lacks the knob, which reads as its default; they are still the study's runs
    runs = sorted((tmp_path / "runs").iterdir())
    _as_written_before_a_knob(runs)
    older = run_study(cfg, tmp_path, run_overrides=extra, log=lambda m: None)
    assert older["runs_trained_now"] == 0 and json_safe(older["frontier"]) == json_safe(res["frontier"])
    # ... but a run whose written config differs in a value is trained again
    text = (runs[0] / "config.toml").read_text()
    (runs[0] / "config.toml").write_text(text.replace("sparse_lr = ", "sparse_lr = 0.5 #", 1))
    assert run_study(cfg, tmp_path, run_overrides=extra, log=lambda m: None)["runs_trained_now"] == 1


def test_isoflop_train_cell_adds_seeds_and_variants(tmp_path):
    """train_cell: more seeds of one cell are trained on the study's stream with the study's rows and names,
    a run already there is reused, and a variant (extra overrides) gets the rows of its own FLOPs."""
    import json

    from opengem.bench.isoflop import load_isoflop_config, run_study, train_cell

    cfg = load_isoflop_config(ISO_SMALL, ["budgets=[1.0e8, 4.0e8]", "seeds=1", "lr_grid=[]", "lr_check=false",
                                          "bootstrap=5", "min_steps=1"], ["dlrm"])
    cfg.families[0].sizes = cfg.families[0].sizes[:1]
    extra = ["data.sim.rows=8000", "data.eval_batch_size=4096"]
    run_study(cfg, tmp_path / "study", run_overrides=extra, log=lambda m: None)
    data = tmp_path / "study" / "data"
    done = tmp_path / "study" / "runs" / "dlrm-s0-b1-lrrecipe-seed0" / "result.json"
    seed0, stamp = json.loads(done.read_text()), done.stat().st_mtime_ns
    recs = train_cell(cfg, tmp_path / "study", data, "dlrm", 0, 1, None, [0, 1], extra, log=lambda m: None)
    assert [r["name"] for r in recs] == ["dlrm-s0-b1-lrrecipe-seed0", "dlrm-s0-b1-lrrecipe-seed1"]
    assert done.stat().st_mtime_ns == stamp and recs[0]["valid"] == seed0["valid"]  # reused, not retrained
    assert recs[0]["examples"] == recs[1]["examples"] == seed0["examples"]
    assert recs[1]["valid"] != recs[0]["valid"]  # another seed
    wide = train_cell(cfg, tmp_path / "wide", data, "dlrm", 0, 1, None, [0],
                      [*extra, "model.dlrm.top_mlp=[512, 256]"], log=lambda m: None)
    assert wide[0]["flops_per_example"] > recs[0]["flops_per_example"]
    assert wide[0]["examples"] < recs[0]["examples"]  # the same budget buys fewer rows
    with pytest.raises(ConfigError, match="no cell"):
        train_cell(cfg, tmp_path / "study", data, "dlrm", 3, 1, None, [0], extra)
    with pytest.raises(ConfigError, match="not in the study"):
        train_cell(cfg, tmp_path / "study", data, "gem", 0, 1, None, [0], extra)


def test_isoflop_learning_rate_chosen_per_budget(tmp_path):
    """lr_budgets = "each": the grid runs at every budget and each budget's frontier trains at that budget's
    own choice (the smallest budget's choice under-tuned DCNv2 at the largest ones in session 12)."""
    from opengem.bench.isoflop import load_isoflop_config, run_study

    cfg = load_isoflop_config(ISO_SMALL, ["budgets=[1.0e8, 4.0e8]", "seeds=1", "lr_grid=[1e-3, 3e-2]",
                                          "lr_check=false", "lr_budgets=each", "bootstrap=5", "min_steps=2"],
                              ["dlrm"])
    cfg.families[0].sizes = cfg.families[0].sizes[:2]
    res = run_study(cfg, tmp_path, run_overrides=["data.sim.rows=8000", "data.eval_batch_size=4096"],
                    log=lambda m: None)
    chosen, grids = res["lr"]["chosen"]["dlrm"], res["lr"]["grid"]["dlrm"]
    assert len(chosen) == len(grids) == 2 and "every budget" in res["lr"]["rule"]
    for b, (lr, grid) in enumerate(zip(chosen, grids)):
        assert set(grid) == {"0.001", "0.03"} and format(lr, "g") == min(grid, key=grid.get)
        assert res["frontier"]["dlrm"][b]["lr"] == lr
        assert {q["size"] for q in res["isoflop_curves"]["dlrm"][b]} == {0, 1}
    from opengem.bench.isoflop_report import format_study

    text = format_study(res)  # the printed report names each budget's choice
    assert f"chose {chosen}" in text and f"budget 1: chose {chosen[1]}" in text
    with pytest.raises(ConfigError, match="lr_budgets"):
        load_isoflop_config(ISO_SMALL, ["lr_budgets=largest"])


def test_isoflop_learning_rate_chosen_per_size(tmp_path):
    """lr_sizes = "each": every rung runs the grid at every budget, and the curves, the size choice and the
    frontier read each size at its own rate."""
    from opengem.bench.isoflop import load_isoflop_config, run_study
    from opengem.bench.isoflop_report import format_study

    cfg = load_isoflop_config(ISO_SMALL, ["budgets=[1.0e8, 4.0e8]", "seeds=1", "lr_grid=[1e-3, 3e-2]",
                                          "lr_check=false", "lr_budgets=each", "lr_sizes=each", "bootstrap=5",
                                          "min_steps=2"], ["dlrm"])
    cfg.families[0].sizes = cfg.families[0].sizes[:2]
    res = run_study(cfg, tmp_path, run_overrides=["data.sim.rows=8000", "data.eval_batch_size=4096"],
                    log=lambda m: None)
    per_size, grids = res["lr"]["per_size"]["dlrm"], res["lr"]["grid"]["dlrm"]
    assert "every ladder rung" in res["lr"]["rule"] and res["runs"] == 8  # 2 budgets x 2 sizes x 2 rates
    for b, grid in enumerate(grids):
        assert set(grid) == {f"s{i} {lr}" for i in (0, 1) for lr in ("0.001", "0.03")}
        for i in (0, 1):
            own = {k.split()[1]: v for k, v in grid.items() if k.startswith(f"s{i} ")}
            assert format(per_size[b][i], "g") == min(own, key=own.get)
        curve = {q["size"]: q["valid_ne"] for q in res["isoflop_curves"]["dlrm"][b]}
        assert curve == {i: grid[f"s{i} {per_size[b][i]:g}"] for i in (0, 1)}
        best = res["frontier"]["dlrm"][b]
        assert best["lr"] == per_size[b][best["size"]] == res["lr"]["chosen"]["dlrm"][b]
        assert best["valid_ne"] == min(curve.values())
    assert "s1 0.03" in format_study(res)
    with pytest.raises(ConfigError, match="lr_sizes must be one or each"):
        load_isoflop_config(ISO_SMALL, ["lr_sizes=all"])


def test_isoflop_learning_rate_chosen_on_several_seeds(tmp_path):
    """lr_seeds = 2: every rate of the grid runs seeds 0 and 1 and the lowest mean validation NE wins (one
    seed's validation NE chose a rate that tested worse in 2 of 8 cells in session 13)."""
    from opengem.bench.isoflop import load_isoflop_config, run_study

    cfg = load_isoflop_config(ISO_SMALL, ["budgets=[1.0e8, 4.0e8]", "seeds=2", "lr_grid=[1e-3, 3e-2]",
                                          "lr_check=false", "lr_seeds=2", "bootstrap=5", "min_steps=2"],
                              ["dlrm"])
    cfg.families[0].sizes = cfg.families[0].sizes[:1]
    res = run_study(cfg, tmp_path, run_overrides=["data.sim.rows=8000", "data.eval_batch_size=4096"],
                    log=lambda m: None)
    import csv

    with open(tmp_path / "isoflop_runs.csv") as f:
        rows = [r for r in csv.DictReader(f) if "lr-grid" in r["roles"]]
    ran = sorted((float(r["lr"]), int(r["seed"])) for r in rows)
    assert ran == [(1e-3, 0), (1e-3, 1), (3e-2, 0), (3e-2, 1)]
    grid = res["lr"]["grid"]["dlrm"]
    for lr in ("0.001", "0.03"):
        assert grid[lr] == pytest.approx(np.mean([float(r["valid_ne"]) for r in rows if r["lr"] == lr]))
    assert format(res["lr"]["chosen"]["dlrm"], "g") == min(grid, key=grid.get)
    assert "seeds 0-1, lowest mean validation NE" in res["lr"]["rule"]
    # the frontier's seeds at the grid's rung and rate are the grid's own runs, not trained twice
    assert res["runs_trained_now"] == 4 + 2 * 1
    with pytest.raises(ConfigError, match="lr_seeds"):
        load_isoflop_config(ISO_SMALL, ["lr_seeds=0"])


def test_isoflop_size_chosen_on_several_seeds(tmp_path):
    """size_seeds = 2: the two sizes with the lowest seed-0 validation NE run seed 1 too, and the lowest mean
    over seeds 0-1 is the budget's size (session 19: a 0.0008 seed-0 difference chose between two sizes whose
    test NE differed by 0.0095)."""
    import csv

    from opengem.bench.isoflop import load_isoflop_config, run_study
    from opengem.bench.isoflop_report import format_study

    cfg = load_isoflop_config(ISO_SMALL, ["budgets=[1.0e8, 4.0e8]", "seeds=1", "lr_grid=[]", "lr_check=false",
                                          "size_seeds=2", "size_finalists=2", "bootstrap=5", "min_steps=1"],
                              ["dlrm"])
    cfg.families[0].sizes = cfg.families[0].sizes[:3]
    res = run_study(cfg, tmp_path, run_overrides=["data.sim.rows=8000", "data.eval_batch_size=4096"],
                    log=lambda m: None)
    with open(tmp_path / "isoflop_runs.csv") as f:
        rows = list(csv.DictReader(f))
    for b in range(2):
        at = [r for r in rows if int(r["budget"]) == b]
        seed0 = sorted((float(r["valid_ne"]), int(r["size"])) for r in at if r["seed"] == "0")
        finalists = {size for _, size in seed0[:2]}
        assert {int(r["size"]) for r in at if r["seed"] == "1"} == finalists  # only the finalists ran seed 1
        mean = {s: np.mean([float(r["valid_ne"]) for r in at if int(r["size"]) == s]) for s in finalists}
        scores = res["size"]["scores"]["dlrm"][b]
        assert {int(k): v for k, v in scores.items()} == pytest.approx(mean)
        chosen = min(mean, key=mean.get)
        assert res["frontier"]["dlrm"][b]["size"] == chosen and res["frontier"]["dlrm"][b]["seeds"] == 2
    assert res["runs_trained_now"] == 2 * 3 + 2 * 2  # every size at seed 0, the finalists at seed 1
    assert "lowest mean validation NE over seeds 0-1" in res["size"]["rule"]
    assert "budget 1: s" in format_study(res)
    with pytest.raises(ConfigError, match="size_seeds"):
        load_isoflop_config(ISO_SMALL, ["size_seeds=0"])


def test_isoflop_frontier_scored_again_on_more_test_rows(tmp_path):
    """frontier_test_rows = 0: the rule chooses exactly as before (validation only), and then every frontier
    run, and only those, is scored on the whole test day from its checkpoint; the frontier's NE is that one,
    equal to `opengem evaluate` of the run; the runs' own slice is kept beside; a rerun reuses the cache."""
    import json

    from opengem.bench.isoflop import load_isoflop_config, run_study
    from opengem.bench.isoflop_report import format_study
    from opengem.train.evaluate import evaluate_run

    base = ["budgets=[1.0e8, 4.0e8]", "seeds=2", "lr_grid=[]", "lr_check=false", "bootstrap=5", "min_steps=2",
            "eval_rows=1024"]
    extra = ["data.sim.rows=16000", "data.eval_batch_size=512"]
    cfg = load_isoflop_config(ISO_SMALL, base, ["dlrm"])
    cfg.families[0].sizes = cfg.families[0].sizes[:2]
    plain = run_study(cfg, tmp_path, run_overrides=extra, log=lambda m: None)
    assert all(p["test_rows"] == "eval_rows" and p["ne_own_test"] is None for p in plain["frontier"]["dlrm"])
    cfg.frontier_test_rows = 0
    logs: list[str] = []
    res = run_study(cfg, tmp_path, run_overrides=extra, log=logs.append)
    assert res["runs_trained_now"] == 0  # the rescoring is not part of a run's identity
    day = 16000 // 8
    scored = sorted(p.name for p in (tmp_path / "runs").iterdir() if (p / "frontier_test.json").exists())
    for b, (p, q) in enumerate(zip(res["frontier"]["dlrm"], plain["frontier"]["dlrm"])):
        assert (p["size"], p["lr"], p["seeds"]) == (q["size"], q["lr"], q["seeds"])  # the same choice
        assert p["test_rows"] == day and p["ne_own_test"] == q["ne_seeds"]
        names = [n for n in scored if f"-s{p['size']}-b{b}-" in n]
        assert len(names) == 2
        for seed, name in enumerate(names):
            ev = evaluate_run(tmp_path / "runs" / name, partitions="day=007", write=False)
            assert ev["rows"] == day
            want = np.mean([ev["metrics"][k]["ne"] for k in ("all/click", "all/conversion")])
            assert p["ne_seeds"][seed] == pytest.approx(want, rel=1e-6)
        assert p["ne_seeds"] != q["ne_seeds"]  # 2,000 rows, not the first 1,024
    assert len(scored) == 2 * 2  # the frontier runs only
    assert "frontier runs scored again on 2,000 test rows" in format_study(res)
    assert any("4 frontier runs scored" in m for m in logs)
    stamp = {n: (tmp_path / "runs" / n / "frontier_test.json").stat().st_mtime_ns for n in scored}
    again = run_study(cfg, tmp_path, run_overrides=extra, log=lambda m: None)
    assert {n: (tmp_path / "runs" / n / "frontier_test.json").stat().st_mtime_ns for n in scored} == stamp
    assert again["frontier"]["dlrm"][1]["ne_seeds"] == res["frontier"]["dlrm"][1]["ne_seeds"]
    cfg.frontier_test_rows = 600  # whole eval batches: 2 x 512
    first = run_study(cfg, tmp_path, run_overrides=extra, log=lambda m: None)
    assert {p["test_rows"] for p in first["frontier"]["dlrm"]} == {1024}
    assert json.loads((tmp_path / "runs" / scored[0] / "frontier_test.json").read_text())["rows"] == 600
    with pytest.raises(ConfigError, match="frontier_test_rows"):
        load_isoflop_config(ISO_SMALL, ["frontier_test_rows=-2"])


def test_isoflop_frontier_calibration_refitted_on_the_whole_validation_day(tmp_path):
    """frontier_calibration_rows = 0: a calibrated study's frontier runs are rescored through a calibration
    fitted now on the whole validation day, the same as `opengem calibrate` then `opengem evaluate` of the
    run; -1 keeps each run's own fit (made on its eval_rows validation rows)."""
    import json

    from opengem.bench.isoflop import load_isoflop_config, run_study
    from opengem.bench.isoflop_report import format_study
    from opengem.train.calibrate import calibrate_run
    from opengem.train.evaluate import evaluate_run

    cfg = load_isoflop_config(ISO_SMALL, ["budgets=[1.0e8, 4.0e8]", "seeds=1", "lr_grid=[]", "lr_check=false",
                                          "bootstrap=5", "min_steps=2", "calibrate=platt", "eval_rows=1024",
                                          "frontier_test_rows=0"], ["dlrm"])
    cfg.families[0].sizes = cfg.families[0].sizes[:1]
    extra = ["data.sim.rows=40000", "data.eval_batch_size=1024"]
    own = run_study(cfg, tmp_path, run_overrides=extra, log=lambda m: None)
    assert all(p["calibration_fit_rows"] is None for p in own["frontier"]["dlrm"])
    cfg.frontier_calibration_rows = 0
    refit = run_study(cfg, tmp_path, run_overrides=extra, log=lambda m: None)
    assert refit["runs_trained_now"] == 0
    assert "their calibration refitted on 5,000 validation rows" in format_study(refit)
    for b, (p, q) in enumerate(zip(refit["frontier"]["dlrm"], own["frontier"]["dlrm"])):
        assert p["calibration_fit_rows"] == 5000 and p["test_rows"] == 5000
        assert p["ne_seeds"] != q["ne_seeds"]  # 5,000 validation rows fit another calibration than 1,024
        run = tmp_path / "runs" / f"dlrm-s0-b{b}-lrrecipe-seed0"
        run = run if run.exists() else next((tmp_path / "runs").glob(f"dlrm-s0-b{b}-*-seed0"))
        own_fit = (run / "calibration.json").read_text()
        calibrate_run(run, method="platt")  # opengem calibrate: data.eval, the whole validation day
        ev = evaluate_run(run, partitions="day=007", write=False)
        (run / "calibration.json").write_text(own_fit)  # the run's own fit back, as the study wrote it
        want = np.mean([ev["metrics"][k]["ne"] for k in ("all/click", "all/conversion")])
        assert p["ne_seeds"][0] == pytest.approx(want, rel=1e-5)
        assert p["calibration"]["pooled"]["all/click"] == pytest.approx(
            ev["metrics"]["all/click"]["calibration"], rel=1e-5)
    cfg.frontier_calibration_rows = -1  # back to each run's own fit: scored again, not the refit's cache
    back = run_study(cfg, tmp_path, run_overrides=extra, log=lambda m: None)
    assert [p["ne_seeds"] for p in back["frontier"]["dlrm"]] == \
        [q["ne_seeds"] for q in own["frontier"]["dlrm"]]
    # (and they are rescored: the refit's cache says calibration_rows, which -1 never reuses)
    assert all("calibration_rows" not in json.loads(f.read_text())
               for f in (tmp_path / "runs").glob("*/frontier_test.json"))
    with pytest.raises(ConfigError, match="frontier_calibration_rows"):
        load_isoflop_config(ISO_SMALL, ["frontier_calibration_rows=-3"])


def test_isoflop_runs_calibrated_on_validation(tmp_path):
    """calibrate = platt: each run's calibration is fitted on its validation rows, test is scored through it
    (the raw test metrics kept beside), and RUN/calibration.json makes `opengem evaluate` score the same."""
    import json

    from opengem.bench.isoflop import load_isoflop_config, run_study
    from opengem.bench.isoflop_report import format_study
    from opengem.train.evaluate import evaluate_run

    cfg = load_isoflop_config(ISO_SMALL, ["budgets=[1.0e8, 4.0e8]", "seeds=1", "lr_grid=[]", "lr_check=false",
                                          "bootstrap=5", "min_steps=2", "calibrate=platt"], ["dlrm"])
    cfg.families[0].sizes = cfg.families[0].sizes[:1]
    res = run_study(cfg, tmp_path, run_overrides=["data.sim.rows=40000", "data.eval_batch_size=4096"],
                    log=lambda m: None)  # ~5,000 validation rows: enough clicks for a fit of their own
    assert res["calibrate"] == "platt"
    assert "platt calibration fitted on its validation rows" in format_study(res)
    for run in sorted((tmp_path / "runs").iterdir()):
        rec = json.loads((run / "result.json").read_text())
        assert rec["calibrate"] == "platt" and rec["test_uncalibrated"]["all/click"]["ne"] > 0
        assert rec["test"]["all/click"]["calibration"] != rec["test_uncalibrated"]["all/click"]["calibration"]
        doc = json.loads((run / "calibration.json").read_text())
        assert doc["fitted_on"]["spec"] == "day=006" and doc["method"] == "platt"
        assert doc["cells"]["feed/click"]["source"] == "own"
        ev = evaluate_run(run, partitions=rec["test_spec"], write=False)
        for k in ("all/click", "all/conversion"):
            assert ev["metrics"][k]["ne"] == pytest.approx(rec["test"][k]["ne"], rel=1e-5)
            assert ev["metrics"][k]["calibration"] == pytest.approx(rec["test"][k]["calibration"], rel=1e-5)
    # the same study trained uncalibrated, then switched to platt: nothing retrained, every run calibrated
    # from its checkpoint, and the same numbers as calibrating right after training
    late = tmp_path / "late"
    cfg.calibrate = "none"
    raw = run_study(cfg, late, run_overrides=["data.sim.rows=40000", "data.eval_batch_size=4096"],
                    data_dir=tmp_path / "data", log=lambda m: None)
    assert raw["runs_trained_now"] == 2 and not (late / "runs" / run.name / "calibration.json").exists()
    cfg.calibrate = "platt"
    upgraded = run_study(cfg, late, run_overrides=["data.sim.rows=40000", "data.eval_batch_size=4096"],
                         data_dir=tmp_path / "data", log=lambda m: None)
    assert upgraded["runs_trained_now"] == 0 and upgraded["calibrate"] == "platt"
    for run in sorted((tmp_path / "runs").iterdir()):
        now = json.loads((run / "result.json").read_text())
        then = json.loads((late / "runs" / run.name / "result.json").read_text())
        assert then["calibrated_after_training"] and then["valid"] == now["valid"]
        for k in ("all/click", "all/conversion"):
            raw_ne = now["test_uncalibrated"][k]["ne"]
            assert then["test_uncalibrated"][k]["ne"] == pytest.approx(raw_ne, rel=1e-6)
            assert then["test"][k]["ne"] == pytest.approx(now["test"][k]["ne"], rel=1e-5)
            assert then["test"][k]["calibration"] == pytest.approx(now["test"][k]["calibration"], rel=1e-5)
    assert run_study(cfg, late, run_overrides=["data.sim.rows=40000", "data.eval_batch_size=4096"],
                     data_dir=tmp_path / "data", log=lambda m: None)["runs_trained_now"] == 0
    with pytest.raises(ConfigError, match="calibrate"):
        load_isoflop_config(ISO_SMALL, ["calibrate=isotonic"])


def test_isoflop_spread_sample_rescores_finished_runs_without_training(tmp_path, monkeypatch):
    """eval_sample = spread: every run scored on eval_rows rows of whole row groups spread over each day; a
    study finished on the days' first rows and switched to spread trains nothing again, and each run's
    validation, calibration and test are what scoring those rows from its checkpoint gives."""
    import json

    from opengem.bench.isoflop import eval_loader, load_isoflop_config, run_study
    from opengem.bench.isoflop_report import format_study
    from opengem.train.evaluate import evaluate_model, open_run

    cfg = load_isoflop_config(ISO_SMALL, ["budgets=[1.0e8, 4.0e8]", "seeds=1", "lr_grid=[]", "lr_check=false",
                                          "bootstrap=5", "min_steps=2", "calibrate=platt", "eval_rows=1024"],
                              ["dlrm"])
    cfg.families[0].sizes = cfg.families[0].sizes[:1]
    extra = ["data.sim.rows=40000", "data.sim.chunk_rows=512", "data.eval_batch_size=512"]
    first = run_study(cfg, tmp_path, run_overrides=extra, log=lambda m: None)
    assert first["runs_trained_now"] == 2 and first["eval"] == {"rows": 1024, "sample": "first"}
    runs = sorted((tmp_path / "runs").iterdir())
    before = {r.name: json.loads((r / "result.json").read_text()) for r in runs}
    cfg.eval_sample = "spread"
    import opengem.bench.isoflop as isoflop_module

    passes: list[str] = []
    loader = isoflop_module.eval_loader
    monkeypatch.setattr(isoflop_module, "eval_loader",
                        lambda holder, spec, *a: passes.append(spec) or loader(holder, spec, *a))
    spread = run_study(cfg, tmp_path, run_overrides=extra, data_dir=tmp_path / "data", log=lambda m: None)
    monkeypatch.setattr(isoflop_module, "eval_loader", loader)
    # per run one pass over validation (its metrics and the calibration's fit) and one over test (raw and
    # calibrated); nothing twice more
    assert sorted(passes) == sorted(["day=006", "day=007"] * len(runs))
    assert spread["runs_trained_now"] == 0 and spread["eval"] == {"rows": 1024, "sample": "spread"}
    assert "1,024 validation and 1,024 test rows: whole row groups spread evenly over each day" in (
        format_study(spread))
    for run in runs:
        rec = json.loads((run / "result.json").read_text())
        old = before[run.name]
        assert rec["eval_sample"] == "spread" and rec["rescored"] and rec["steps"] == old["steps"]
        assert rec["valid"]["all/click"]["ne"] != old["valid"]["all/click"]["ne"]  # other rows
        doc = json.loads((run / "calibration.json").read_text())
        assert doc["fitted_on"]["rows"] == 1024
        with open_run(run, calibrated=False) as r:
            batches, max_batches = eval_loader(r, r.cfg.data.eval, 1024, "spread")
            valid = evaluate_model(r.model, batches, r.ds.schema, r.device, max_batches=max_batches)
        assert valid["rows"] == 1024 and max_batches == 0
        for k in ("all/click", "all/conversion"):
            assert valid["metrics"][k]["ne"] == pytest.approx(rec["valid"][k]["ne"], rel=1e-6)
        with open_run(run) as r:  # calibrated as the study fitted it on those validation rows
            batches, _ = eval_loader(r, rec["test_spec"], 1024, "spread")
            test = evaluate_model(r.model, batches, r.ds.schema, r.device)
        for k in ("all/click", "all/conversion"):
            assert test["metrics"][k]["ne"] == pytest.approx(rec["test"][k]["ne"], rel=1e-5)
    after = {r.name: (r / "result.json").read_text() for r in runs}
    again = run_study(cfg, tmp_path, run_overrides=extra, data_dir=tmp_path / "data", log=lambda m: None)
    assert again["runs_trained_now"] == 0 and {r.name: (r / "result.json").read_text() for r in runs} == after
    # trained with spread from the start: the same validation and test as the rescored runs
    fresh = run_study(cfg, tmp_path / "fresh", run_overrides=extra, data_dir=tmp_path / "data",
                      log=lambda m: None)
    assert fresh["runs_trained_now"] == 2
    for run in runs:
        rec = json.loads(after[run.name])
        new = json.loads((tmp_path / "fresh" / "runs" / run.name / "result.json").read_text())
        assert "rescored" not in new and new["eval_sample"] == "spread"
        for part in ("valid", "test"):
            for k in ("all/click", "all/conversion"):
                assert new[part][k]["ne"] == pytest.approx(rec[part][k]["ne"], rel=1e-5)
    with pytest.raises(ConfigError, match="eval_sample"):
        load_isoflop_config(ISO_SMALL, ["eval_sample=random"])


def test_isoflop_cli_errors(capsys):
    from cli_helpers import one_error_line, run_cli

    rc, err = run_cli(capsys, ["scale", "--design", "sweep"])
    assert rc == 2 and "--config" in one_error_line(err, "scale")
    rc, err = run_cli(capsys, ["scale", "--design", "isoflop", "--budget", "small", "--families", "gem,nope"])
    assert rc == 2 and "nope" in one_error_line(err, "scale")


@pytest.mark.slow
def test_isoflop_small_budget(tmp_path, capsys):
    """The `--budget small` study through the CLI (minutes): every family's frontier, law and ratio, the
    lr grid and its transfer check; a run whose result is lost (a killed study) is retrained alone."""
    import json

    from opengem.cli import main

    argv = ["scale", "--design", "isoflop", "--budget", "small", "--out", str(tmp_path)]
    assert main(argv) == 0
    res = json.loads((tmp_path / "isoflop.json").read_text())
    for fam, grid in res["lr"]["grid"].items():
        assert len(grid) == 3 and res["lr"]["chosen"][fam] == float(min(grid, key=grid.get))
        assert format(res["lr"]["chosen"][fam], "g") in res["lr"]["check_largest_budget"][fam]
    assert set(res["frontier"]) == {"gem", "dcnv2", "dlrm", "wukong"}
    assert all(len(fr) == 4 and all(p["seeds"] == 3 for p in fr) for fr in res["frontier"].values())
    assert res["budgets"][-1] / res["budgets"][0] >= 30
    assert set(res["efficiency"]) == {"dcnv2", "dlrm", "wukong"}
    assert "frontier" in capsys.readouterr().out
    sorted((tmp_path / "runs").glob("*/result.json"))[0].unlink()
    assert main(argv) == 0
    assert json.loads((tmp_path / "isoflop.json").read_text())["runs_trained_now"] == 1


@pytest.mark.parametrize("budget", ["small", "default", "large"])
def test_isoflop_configs_load_and_round_trip(tmp_path, budget):
    from opengem.bench.isoflop import default_config_path, load_isoflop_config
    from opengem.config import save_config

    cfg = load_isoflop_config(default_config_path(budget))
    assert len(cfg.budgets) >= 4 and cfg.budgets[-1] / cfg.budgets[0] >= 30 and cfg.seeds >= 3
    names = [f.name for f in cfg.families]  # run_families
    assert names == ["gem", "dcnv2", "dlrm", "wukong"] + (["din"] if budget == "default" else [])
    assert all(len(size_overrides(f)) >= 3 for f in cfg.families)
    save_config(cfg, tmp_path / "iso.toml")
    assert load_isoflop_config(tmp_path / "iso.toml") == cfg
    with_din = load_isoflop_config(default_config_path(budget), families=["gem", "din"])
    assert [f.name for f in with_din.families] == ["gem", "din"]


def test_welch_difference_of_two_families_frontier_seeds():
    from opengem.bench.isoflop_report import welch_difference

    r = welch_difference([0.80, 0.81, 0.79], [0.85, 0.86, 0.84])  # se 0.008165, df 4, t 2.776
    assert abs(r["diff"] + 0.05) < 1e-12 and r["excludes_zero"]
    assert abs(r["ci95"][0] + 0.05 + 2.776 * 0.0081650) < 1e-4 and abs(r["ci95"][1] + 0.05 - 0.0226663) < 1e-4
    r = welch_difference([1.0, 2.0, 3.0], [0.0, 0.0, 0.0])  # all the variance on one side: df 2, t 4.303
    assert abs(r["ci95"][0] - (2 - 4.303 * (1 / 3) ** 0.5)) < 1e-3 and not r["excludes_zero"]
    assert welch_difference([0.9], [0.8, 0.85])["ci95"][0] != welch_difference([0.9], [0.8, 0.85])["ci95"][0]
    assert welch_difference([], [0.8])["excludes_zero"] is False


def test_format_difference_prints_the_interval_and_stars_what_excludes_zero():
    from opengem.bench.isoflop_report import format_difference, welch_difference

    excludes = welch_difference([0.80, 0.81, 0.79], [0.85, 0.86, 0.84])  # -0.05 +- 2.776 x 0.008165
    assert format_difference(excludes) == "-0.0500 [-0.0727, -0.0273] *"
    includes = welch_difference([1.0, 2.0, 3.0], [0.0, 0.0, 0.0])  # 2 +- 4.303 x 0.5774
    assert format_difference(includes) == "+2.0000 [-0.4843, +4.4843]"


def test_isoflop_scorecard_reads_the_targets_off_the_report():
    """The scorecard says where the reference is below each family, whether the largest budget's interval
    excludes 0, the efficiency ratio against the 2x target (the interval's lower end decides "meets"),
    calibration in bounds per family and the DLRM -> oracle gap closed at the largest budget."""
    from opengem.bench.isoflop_report import scorecard

    def point(pooled_ok: bool, cells_ok: bool) -> dict:
        return {"calibration": {"pooled_ok": pooled_ok, "cells_ok": cells_ok}}

    def diff(d: float, lo: float, hi: float) -> dict:
        return {"diff": d, "ci95": [lo, hi], "excludes_zero": lo > 0 or hi < 0}

    def eff(ratio: float, lo: float, hi: float) -> dict:
        return {"ratio": ratio, "ci95": [lo, hi], "reachable": True}

    res = {"efficiency_reference": "gem", "budgets": [1e9, 1e10],
           "frontier": {"gem": [point(True, True), point(True, False)],
                        "dlrm": [point(True, True), point(False, False)]},
           "difference_vs_reference": {"dlrm": [diff(0.01, 0.005, 0.015), diff(-0.02, -0.03, -0.01)],
                                       "dcnv2": [diff(-0.01, -0.02, 0.01), diff(-0.001, -0.01, 0.008)]},
           "efficiency": {"dlrm": [eff(0.5, 0.4, 0.6), eff(3.0, 2.5, 4.0)],
                          "dcnv2": [eff(1.0, 0.5, 2.0), eff(2.2, 1.4, 5.0)]},
           "gap_closed_vs_dlrm": {"gem": [{"all/click": 0.1}, {"all/click": 0.3, "all/conversion": 0.6}]}}
    text = "\n".join(scorecard(res))
    assert "vs dlrm    gem below at 1 of 2 budgets (1.00e+10); at the largest: below, interval excludes 0" \
        in text
    assert "vs dcnv2   gem below at 2 of 2 budgets" in text and "at the largest: interval spans 0" in text
    assert "efficiency vs dlrm    at the largest budget 3x [95 % 2.5, 4] (meets the 2x target)" in text
    assert "2.2x [95 % 1.4, 5] (the point estimate meets, the interval reaches below, the 2x target)" in text
    assert "calibration gem     pooled in [0.95, 1.05] at 2 of 2 budgets, every cell in [0.85, 1.15] at 1 " \
        "of 2" in text
    assert "calibration dlrm    pooled in [0.95, 1.05] at 1 of 2" in text
    assert "all/click 30.0%, all/conversion 60.0% (target 50%: not met)" in text


def test_isoflop_train_window_latest_reads_the_newest_days(tmp_path):
    """train_window = latest: a run reads the latest whole training days that hold its rows (all of them
    when it needs more); the default reads every training day."""
    from opengem.bench.isoflop import latest_days, load_isoflop_config, prepare_study

    days = [("day=000", 10), ("day=001", 10), ("day=002", 10)]
    assert latest_days(days, 5) == latest_days(days, 10) == "day=002"
    assert latest_days(days, 11) == "day=001,day=002" and latest_days(days, 99) == "day=000,day=001,day=002"
    studies = {}
    for window in ("all", "latest"):
        cfg = load_isoflop_config(ISO_SMALL, [f"train_window={window}"])
        studies[window] = prepare_study(cfg, tmp_path / window, None, ["data.sim.rows=8000"], lambda m: None,
                                        plan_only=True)
    st = studies["latest"]
    fam, train = st.cfg.families[0], st.train_spec.split(",")
    assert [d for d, _ in st.day_rows] == train and len(train) >= 2
    batch = st.run_config(fam, 0, 1, None, 0).data.batch_size
    first_day = st.day_rows[-1][1]
    assert st.run_config(fam, 0, 1, None, 0).data.train == train[-1]
    assert st.run_config(fam, 0, first_day // batch + 1, None, 0).data.train == ",".join(train[-2:])
    assert st.run_config(fam, 0, st.train_rows // batch, None, 0).data.train == st.train_spec
    assert studies["all"].run_config(fam, 0, 1, None, 0).data.train == studies["all"].train_spec
    assert st.run_config(fam, 0, 1, None, 0).data.skip_batches == 0
    with pytest.raises(ConfigError, match="train_window"):
        load_isoflop_config(ISO_SMALL, ["train_window=newest"])


def test_isoflop_train_window_latest_rows_ends_on_the_newest_rows(tmp_path):
    """train_window = latest_rows: latest's days, read in time order, the first batches dropped so that the
    run's last step reads the newest rows (all of them when it needs more rows than the days hold)."""
    from opengem.bench.isoflop import load_isoflop_config, prepare_study

    cfg = load_isoflop_config(ISO_SMALL, ["train_window=latest_rows"])
    st = prepare_study(cfg, tmp_path, None, ["data.sim.rows=8000"], lambda m: None, plan_only=True)
    fam, train = st.cfg.families[0], st.train_spec.split(",")
    batch = st.run_config(fam, 0, 1, None, 0).data.batch_size
    day = st.day_rows[-1][1]
    for steps, days in ((1, train[-1:]), (day // batch, train[-1:]), (day // batch + 1, train[-2:])):
        rc = st.run_config(fam, 0, steps, None, 0)
        held = sum(n for d, n in st.day_rows if d in days)
        assert rc.data.train == ",".join(days) and not rc.data.shuffle
        assert rc.data.skip_batches == held // batch - steps  # skipped + trained = the days' full batches
    assert st.run_config(fam, 0, st.train_rows // batch + 5, None, 0).data.skip_batches == 0
