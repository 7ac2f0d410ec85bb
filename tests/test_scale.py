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


@pytest.mark.slow
def test_scale_tiny_sweep_end_to_end(tmp_path):
    from opengem.cli import main

    assert main(["scale", "--config", str(TINY_SWEEP), "--out", str(tmp_path)]) == 0
    _check_outputs(tmp_path, {"gem", "dlrm", "dcnv2"})
    import json

    fits = json.loads((tmp_path / "fits.json").read_text())
    assert fits["proxy"]["n"] == 9 and -1 <= fits["proxy"]["spearman"] <= 1
