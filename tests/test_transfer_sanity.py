"""Sanity arms on configs/transfer-tiny.toml (slow: the whole pipeline, about a minute on 2 cores).

With no surface bias and no staleness the FM is as fresh and calibrated as it gets, so the Student
Adapter has nothing to correct: it must stay near the identity, and KD through the adapter must give the
same gain as KD itself (R near 1). Every arm also runs end to end and writes transfer.json.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from opengem.transfer.aggregate import aggregate
from opengem.transfer.arms import arm_configs
from opengem.transfer.experiment import run_experiment
from opengem.transfer.experiment_config import load_experiment_config
from opengem.transfer.seed_run import SeedRun
from opengem.transfer.vm_train import clone_arm

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cfg = load_experiment_config("configs/transfer-tiny.toml")
    return cfg, tmp_path_factory.mktemp("transfer")


def test_adapter_is_identity_and_r_near_one_without_bias_or_staleness(tiny):
    from opengem.train.distributed import process_group
    from opengem.train.env import resolve_device

    cfg, out = tiny
    assert cfg.lag == 0 and not cfg.surface_bias
    dev = resolve_device("cpu")
    with process_group(dev) as pg:
        run = SeedRun(cfg, cfg.seeds[0], out / "sanity", dev, pg)
        arms = arm_configs(cfg, cfg.kd.grid[-1])
        arms["kd_adapter"] = clone_arm(arms["kd"], name="kd_adapter", adapter=True)
        res = run.run_lag(0, ["baseline", "kd", "kd_adapter"], arms, kd_results={})
    agg = aggregate([res], ["baseline", "kd", "kd_adapter"], cfg)
    corr = res["feed"]["kd_adapter"]["adapter_mean_abs_correction"]
    assert max(corr) < 0.3, f"adapter moved FM logits by {corr} on average: not near the identity"
    m = agg["arms"]["kd_adapter"]["feed/click"]
    kd_gain = agg["arms"]["baseline"]["feed/click"]["ne"] - agg["arms"]["kd"]["feed/click"]["ne"]
    assert kd_gain > 0, "KD must help on the tiny stream for R to be meaningful"
    assert abs(m["r"] - 1) < 0.25, f"R of KD+adapter vs KD = {m['r']}"


def test_all_arms_run_and_write_results(tiny):
    cfg, out = tiny
    res = run_experiment(cfg, out / "all", log=lambda *a: None)
    data = json.loads((out / "all" / "transfer.json").read_text())
    for arm in cfg.arms:
        m = data["arms"][arm]["feed/click"]
        for k in ("ne", "ne_gain", "tr", "r", "r_ci", "fm_ne"):
            assert k in m
        assert np.isfinite(m["ne"])
    assert data["fm"]["feed/click"]["ne"] > 0
    assert data["arms"]["kd"]["feed/click"]["r"] == pytest.approx(1.0)
    flops = res["serving_flops"]
    assert flops["aux_head"]["serving_flops_per_example"] == flops["baseline"]["serving_flops_per_example"]
    assert (
        flops["fm_embeddings"]["serving_flops_per_example"] > flops["baseline"]["serving_flops_per_example"]
    )
    assert flops["param_sharing"]["shared_fm_params"] > 0
    # the shared FM sequence encoder is served: param_sharing costs more than fm_embeddings alone
    assert (
        flops["param_sharing"]["serving_flops_per_example"]
        > flops["fm_embeddings"]["serving_flops_per_example"]
    )
    assert res["generation"]["examples_per_s"] > 0


def test_side_table_respects_no_leakage_and_generation_resumes(tiny):
    import pyarrow.parquet as pq

    from opengem.transfer.generate import generate

    cfg, out = tiny
    root = out / "all" / f"seed{cfg.seeds[0]}"
    parts = sorted((root / "knowledge_lag0").glob("*.parquet"))
    assert parts
    for f in parts:
        t = pq.read_table(f)
        ver = t.column("fm_version").to_numpy()
        ts = t.column("ts").to_numpy()
        tt = t.column("fm_trained_through").to_numpy()
        assert (ver >= 0).any()
        assert np.all(tt[ver >= 0] < ts[ver >= 0]), f"{f}: an FM version trained through the example's time"
    again = generate(root / "fm", root / "data", root / "knowledge_lag0", lag=0, partitions=parts[0].stem)
    assert again["skipped_parts"] == 1 and again["rows"] == 0
