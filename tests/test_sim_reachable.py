"""benchmarks/sim_reachable.py: the latent products it records are the ones behind the simulator's rotating
terms (so its stationary features can represent everything but the drift), and the report runs end to end."""

import contextlib
import importlib.util
import io
import math
from pathlib import Path

import numpy as np

from opengem.data.sim_config import SimConfig
from opengem.data.sim_core import World
from opengem.data.simulate import simulate

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("sim_reachable", REPO / "benchmarks" / "sim_reachable.py")
sim_reachable = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sim_reachable)

TINY = dict(rows=1200, days=3, users=200, ads=200, advertisers=20, topics=10, seq_mean=4.0, seq_max=8,
            chunk_rows=100)


def test_recorded_products_rebuild_the_rotating_terms(tmp_path):
    cfg = SimConfig(**TINY)
    simulate(cfg, tmp_path / "d")
    t = sim_reachable.regenerate(tmp_path / "d", {0, 2})
    world = World(cfg)
    n = len(t["y"])
    assert n == 800 and set(np.unique(t["day"])) == {0, 2}
    s, K = t["surface"], cfg.latent_dim
    w = world.rotating_weights(s, t["tday"])
    np.testing.assert_allclose(world.sp[s, 4] * (t["attr_prod"] * w).sum(1) / math.sqrt(K), t["t_cross2"],
                               atol=1e-12)
    np.testing.assert_allclose(cfg.id_weight * world.sp[s, 4] * (t["id_prod"] * w).sum(1) / math.sqrt(K),
                               t["t_id_latent"], atol=1e-12)
    # the stationary columns: every term but the two rotating ones, the hour's cycle and the 2 x 8 products
    x = sim_reachable.features(t, np.arange(n), per_id=True, rotating=False)
    assert x.shape == (n, len(sim_reachable.STATIONARY) + 2 + K + len(sim_reachable.PER_ID_STATIONARY) + K)


def test_recorded_conversion_terms_rebuild_the_true_conversion_probability(tmp_path):
    """The conversion bound's columns are exactly the simulator's conversion-given-click inputs: with the
    simulator's own weights they give back its conversion probability (so only the weights are fitted)."""
    cfg = SimConfig(**TINY)
    simulate(cfg, tmp_path / "d")
    t = sim_reachable.regenerate(tmp_path / "d", {1})
    world = World(cfg)
    s, K, idw = t["surface"], cfg.latent_dim, cfg.id_weight
    logit = (world.sp[s, 7] + t["c_objective"] + 0.8 * idw * t["cvr_id_prod"].sum(1) / math.sqrt(K)
             + 0.6 * t["cvr_attr_prod"].sum(1) / math.sqrt(K) + 1.2 * t["c_recent"] + 0.6 * t["c_affinity"]
             + 0.3 * idw * t["c_ad_bias"] + 0.3 * t["c_age"] + 0.3 * t["c_fmt_bias"])
    np.testing.assert_allclose(t["p"] / (1 + np.exp(-logit)), t["p_conv"], rtol=1e-12)
    assert not (t["conv"] > t["y"]).any()  # a conversion follows a click
    n, terms = len(s), len(sim_reachable.CVR_TERMS)
    assert sim_reachable.cvr_features(t, np.arange(n), per_id=False).shape == (n, terms + K)
    assert sim_reachable.cvr_features(t, np.arange(n), per_id=True).shape == (
        n, terms + K + len(sim_reachable.CVR_PER_ID) + K)


def test_report_prints_the_bound_and_the_shares(tmp_path):
    simulate(SimConfig(**TINY), tmp_path / "d")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert sim_reachable.main([str(tmp_path / "d"), "--train-days", "0-1", "--rows", "500",
                                   "--ref", "dlrm=0.95", "--ref", "gem=0.9"]) == 0
    text = out.getvalue()
    assert "the bound" in text and "gap closed" in text and "gem (given)" in text
    oracle = next(ln for ln in text.splitlines() if "oracle (true" in ln)
    assert oracle.rstrip().endswith("100.0%")


def test_conversion_report_scores_observed_labels(tmp_path):
    simulate(SimConfig(**TINY), tmp_path / "d")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert sim_reachable.main([str(tmp_path / "d"), "--train-days", "0-1", "--rows", "800", "--task",
                                   "conversion", "--score", "whole", "--ref", "dlrm=0.99"]) == 0
    text = out.getvalue()
    assert "conversion NE on all of day 2" in text and "with an observed label" in text
    assert "the bound" in text
