"""summarize_key without the KD arm: a baseline-only experiment (the bigger baseline VMs a Pareto comparison
needs, ``arms = ["baseline"]``, which the config allows) gets its NE, gain and TR, and no R (R is relative
to KD). It used to end every such run, after all its training, in a KeyError."""

from __future__ import annotations

import numpy as np
import pytest

from opengem.transfer.experiment import run_experiment
from opengem.transfer.experiment_config import load_experiment_config
from opengem.transfer.results import KD_GAIN_UNRESOLVED, arms_table, summarize_key


def _seed(rng: np.random.Generator, arms: list[str]) -> dict[str, dict[str, np.ndarray]]:
    y = (rng.random(400) < 0.3).astype(np.float32)
    out = {}
    for i, a in enumerate([*arms, "fm"]):
        p = np.clip(0.3 + 0.25 * (y - 0.3) * (i + 1) / 3 + rng.normal(0, 0.05, 400), 0.01, 0.99)
        out[a] = {"p": p.astype(np.float32), "y": y}
    return out


def test_summarize_key_without_kd_reports_ne_and_tr_but_no_r():
    rng = np.random.default_rng(0)
    data = [_seed(rng, ["baseline"]) for _ in range(3)]
    out = summarize_key(data, ["baseline"], "baseline", "kd", n_boot=20)
    b = out["baseline"]
    assert np.isfinite(b["ne"]) and b["ne_gain"] == 0 and b["tr"] == 0
    assert b["r"] is None and b["r_ci"] is None
    assert out["fm"]["ne"] < b["ne"]  # the teacher is better here, so TR is defined


def test_summarize_key_with_kd_still_gives_r():
    rng = np.random.default_rng(1)
    data = [_seed(rng, ["baseline", "kd"]) for _ in range(3)]
    out = summarize_key(data, ["baseline", "kd"], "baseline", "kd", n_boot=20)
    assert out["kd"]["r"] == 1.0 and out["kd"]["r_ci"] is not None


@pytest.mark.slow
def test_baseline_only_experiment_runs_to_its_table(tmp_path):
    """The whole pipeline with ``arms = ["baseline"]`` and a validation window (about 25 s): it used to end
    in a KeyError after all its training (the calibration table and summarize_key needed the KD arm)."""
    cfg = load_experiment_config("configs/transfer-tiny.toml",
                                 ['arms=["baseline"]', "validation_windows=1", "data.sim.days=4"])
    res = run_experiment(cfg, tmp_path / "base", log=lambda *a: None)
    m = res["arms"]["baseline"]["feed/click"]
    assert np.isfinite(m["ne"]) and m["r"] is None and res["calibration"] == {}


def test_r_is_withheld_where_kd_gain_ci_includes_zero():
    """KD that predicts what the baseline predicts (up to noise) leaves R's denominator unresolved: the
    session-8 final seeds printed R = -269 [-1698, 1977] for such a surface. R and its CI are withheld with
    the reason; TR is still measured."""
    rng = np.random.default_rng(2)
    data = []
    for _ in range(3):
        s = _seed(rng, ["baseline", "x", "arm"])
        s["kd"] = {"p": np.clip(s["baseline"]["p"] + rng.normal(0, 1e-3, 400), 0.01, 0.99).astype(np.float32),
                   "y": s["baseline"]["y"]}
        data.append(s)
    out = summarize_key(data, ["baseline", "kd", "arm"], "baseline", "kd", n_boot=50)
    for a in ("kd", "arm"):
        assert out[a]["r"] is None and out[a]["r_ci"] is None
        assert out[a]["r_withheld"] == KD_GAIN_UNRESOLVED
    assert out["arm"]["tr"] > 0.5
    assert "undefined" in arms_table({"arms": {"arm": {"feed/click": out["arm"]}}}, ["arm"])


def test_r_is_kept_where_kd_gain_is_resolved():
    rng = np.random.default_rng(3)
    data = [_seed(rng, ["baseline", "kd", "arm"]) for _ in range(3)]
    out = summarize_key(data, ["baseline", "kd", "arm"], "baseline", "kd", n_boot=50)
    assert "r_withheld" not in out["arm"] and out["arm"]["r"] > 1 and out["arm"]["r_ci"] is not None
