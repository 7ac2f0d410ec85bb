"""Issue 14, calibration: the label-noise interval every calibration comes with, and the demo's calibration
table (against the labels and against the simulator's true probabilities) with its target verdict."""

import numpy as np
import pytest

from opengem.config import ConfigError
from opengem.demo import (
    calibration_summary,
    calibration_verdict,
    epoch_steps,
    format_calibration,
    load_demo_config,
)
from opengem.metrics import calibration_interval, summarize, wilson_interval


def test_wilson_interval_textbook_values():
    # Newcombe 1998 ("Two-sided confidence intervals for the single proportion"), table I, Wilson score
    for (k, n), want in {(81, 263): (0.2553, 0.3662), (15, 148): (0.0624, 0.1605), (0, 20): (0.0, 0.1611),
                         (1, 29): (0.0061, 0.1718)}.items():
        assert wilson_interval(k, n) == pytest.approx(want, abs=1e-4), (k, n)
    assert all(np.isnan(wilson_interval(0, 0)))


def test_calibration_interval_covers_a_calibrated_model_95_percent_of_the_time():
    """A model predicting the true p exactly: its calibration's interval holds 1.0 in ~95 % of draws, even
    with a few dozen positives per draw (the demo's rare conversion cells)."""
    rng = np.random.default_rng(0)
    hits, trials = 0, 400
    for _ in range(trials):
        p = rng.uniform(0.002, 0.03, 2000)  # ~32 positives expected
        y = (rng.random(2000) < p).astype(float)
        lo, hi = calibration_interval(p, y)
        hits += lo <= 1.0 <= hi
    assert 0.92 <= hits / trials <= 0.995


def test_calibration_interval_excludes_one_for_a_clearly_biased_model():
    rng = np.random.default_rng(1)
    p = rng.uniform(0.05, 0.15, 20000)
    y = (rng.random(20000) < p).astype(float)
    lo, hi = calibration_interval(0.7 * p, y)
    assert hi < 0.8 and lo > 0.6


def test_summarize_reports_the_interval_around_calibration():
    y = np.array([1, 0, 0, 0] * 25, dtype=float)
    m = summarize(np.full(100, 0.3), y)
    assert m["calibration"] == pytest.approx(1.2)
    assert m["calibration_lo"] < 1.2 < m["calibration_hi"]
    none = summarize(np.full(10, 0.1), np.zeros(10))
    assert none["calibration"] is None and none["calibration_lo"] is None and none["calibration_hi"] is None


def _result(cells):
    return {"metrics": {k: {"calibration": c, "calibration_lo": lo, "calibration_hi": hi, "base_rate": r}
                        for k, (c, lo, hi, r) in cells.items()}}


def test_calibration_summary_separates_label_noise_from_model_bias():
    # observed rate 0.010 but the rows' true probabilities average 0.012: the labels came out low
    truth = {"feed/conversion": (0.012, 0.010), "all/conversion": (0.012, 0.012)}
    res = {"m": _result({"feed/conversion": (1.2, 0.9, 1.6, 0.010),
                         "all/conversion": (1.0, 0.95, 1.05, 0.012)})}
    s = calibration_summary(res, truth)
    assert s["m"]["feed/conversion"]["vs_truth"] == pytest.approx(1.0)  # 0.012 / 0.012: the model is right
    assert s["oracle"]["feed/conversion"]["cal"] == pytest.approx(1.2)  # the true p reads 1.2 as well
    text = format_calibration(s)
    assert "feed/conversion" in text and "t1.00" in text


def test_calibration_verdict_bands_and_noise():
    res = {
        "good": _result({"all/click": (0.97, 0.95, 0.99, 0.1), "feed/click": (0.88, 0.8, 0.96, 0.1)}),
        "noisy": _result({"all/click": (1.0, 0.98, 1.02, 0.1),
                          "messaging/conversion": (0.7, 0.45, 1.2, 0.01)}),
        "biased": _result({"all/click": (0.93, 0.92, 0.94, 0.1), "video/click": (1.3, 1.2, 1.4, 0.1)}),
    }
    lines = dict(line.split(None, 1) for line in calibration_verdict(calibration_summary(res, {})))
    assert lines["good"] == "all in band"
    assert "beyond label noise: none" in lines["noisy"] and "messaging/conversion 0.70" in lines["noisy"]
    assert "all/click 0.93" in lines["biased"].split(";")[0] and "video/click 1.30" in lines["biased"]


def test_demo_schedule_config():
    assert epoch_steps(171_429, 512, 1) == 334  # the demo's pass over days 0-5, last partial batch dropped
    assert epoch_steps(100, 512, 1) == 1
    cfg = load_demo_config(None, [])
    assert cfg.lr_decay == "cosine" and 0 < cfg.min_lr_ratio < 1
    with pytest.raises(ConfigError, match="lr_decay"):
        load_demo_config(None, ['lr_decay="linear"'])
    with pytest.raises(ConfigError, match="min_lr_ratio"):
        load_demo_config(None, ["min_lr_ratio=0"])
