"""Issue 15 item 3: R is reported only for arms within +10 % of the baseline VM's serving FLOPs/example."""

from __future__ import annotations

import numpy as np

from opengem.transfer.aggregate import ADDS_SERVING_COMPUTE, aggregate
from opengem.transfer.experiment_config import ExperimentConfig
from opengem.transfer.results import arms_table


def _seed(rng: np.random.Generator, flops: dict[str, int]) -> dict:
    """One seed's predictions on one surface: each arm a little better than the baseline, the FM best."""
    n = 400
    y = (rng.random(n) < 0.3).astype(np.float32)
    ids = np.arange(n)
    true = np.where(y > 0, 1.0, -1.0)
    res = {"tasks": ["click"], "fm": {"example_id": ids, "logits": (2.0 * true)[:, None],
                                      "available": np.ones((n, 1), bool)}}
    for i, (arm, f) in enumerate(flops.items()):
        logit = (0.2 + 0.3 * i) * true + rng.normal(0, 1, n)
        res[arm] = {"example_id": ids, "logits": logit[:, None], "labels": y[:, None],
                    "mask": np.ones((n, 1), bool), "serving_flops": f}
    return {"feed": res}


def test_r_is_withheld_for_arms_that_add_serving_compute():
    flops = {"baseline": 1000, "kd": 1000, "aux_head": 1100, "fm_embeddings": 1101, "param_sharing": 9000}
    rng = np.random.default_rng(0)
    agg = aggregate([_seed(rng, flops), _seed(rng, flops)], list(flops), ExperimentConfig(bootstrap=20))
    arms = {a: agg["arms"][a]["feed/click"] for a in flops}
    assert arms["kd"]["r"] is not None and arms["aux_head"]["r"] is not None  # +10 % exactly: kept
    assert arms["aux_head"]["serving_flops_ratio"] == 1.1
    for a in ("fm_embeddings", "param_sharing"):
        assert arms[a]["r"] is None and arms[a]["r_ci"] is None
        assert arms[a]["r_withheld"] == ADDS_SERVING_COMPUTE and arms[a]["tr"] is not None
    table = arms_table(agg, list(flops))
    assert table.count(ADDS_SERVING_COMPUTE) == 2 and "9.00" in table  # the FLOPs ratio is shown


def test_results_without_flops_keep_r():
    rng = np.random.default_rng(1)
    seed = _seed(rng, {"baseline": 1, "kd": 1})
    for arm in ("baseline", "kd"):
        del seed["feed"][arm]["serving_flops"]
    m = aggregate([seed], ["baseline", "kd"], ExperimentConfig(bootstrap=20))["arms"]["kd"]["feed/click"]
    assert m["r"] is not None and m["serving_flops"] is None
