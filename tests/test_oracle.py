import math

import numpy as np
import pyarrow.parquet as pq
import pytest

from opengem.data.dataset import DatasetError
from opengem.data.oracle import NEAccumulator, accumulate, format_table, oracle_ne
from opengem.data.simulate import SimConfig, simulate


def test_base_rate_predictor_has_ne_one_and_perfect_has_ne_zero():
    rng = np.random.default_rng(0)
    y = (rng.random(5000) < 0.1).astype(float)
    acc = NEAccumulator()
    acc.update("a", np.full(y.shape, y.mean()), y)
    acc.update("b", y, y)
    assert acc.ne("a") == pytest.approx(1.0, abs=1e-9)
    assert acc.ne("b") < 1e-5


def test_matches_direct_formula_streamed_and_masked():
    rng = np.random.default_rng(1)
    p = rng.uniform(0.01, 0.3, 1000)
    y = (rng.random(1000) < p).astype(float)
    obs = rng.random(1000) < 0.8
    acc = NEAccumulator()
    for s in range(0, 1000, 128):  # streamed in pieces
        acc.update("k", p[s:s + 128], y[s:s + 128], obs[s:s + 128])
    pp, yy = p[obs], y[obs]
    b = yy.mean()
    ll = -np.mean(yy * np.log(pp) + (1 - yy) * np.log(1 - pp))
    assert acc.ne("k") == pytest.approx(ll / -(b * math.log(b) + (1 - b) * math.log(1 - b)), rel=1e-9)
    assert acc.count("k") == obs.sum() and acc.mean_p("k") == pytest.approx(pp.mean())
    other = NEAccumulator()
    other.update("k", p, y, obs)
    merged = NEAccumulator()
    merged.merge(other)
    assert merged.ne("k") == pytest.approx(acc.ne("k"))
    assert "k" in format_table(acc.table())


def test_degenerate_and_bad_input():
    acc = NEAccumulator()
    acc.update("none", np.array([0.1, 0.2]), np.array([0.0, 0.0]))
    assert math.isnan(acc.ne("none"))
    with pytest.raises(ValueError, match="bad"):
        acc.update("bad", np.array([0.1]), np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="NaN"):
        acc.update("nan", np.array([np.nan]), np.array([1.0]))


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    out = tmp_path_factory.mktemp("osim")
    cfg = SimConfig(rows=2000, days=2, users=1000, ads=1000, topics=40, seq_mean=10.0, seq_max=40,
                    chunk_rows=500)
    simulate(cfg, out)
    return out


def test_partitions_select_and_split_adds_up(sim):
    all_ = accumulate(sim)
    d0, d1 = accumulate(sim, "day=000"), accumulate(sim, "@last")
    assert set(oracle_ne(sim)) == set(all_.keys())
    for k in all_.keys():
        assert d0.count(k) + d1.count(k) == all_.count(k)
        assert oracle_ne(sim, "day=000")[k] == pytest.approx(d0.ne(k), nan_ok=True)
    with pytest.raises(DatasetError, match="no partition"):
        oracle_ne(sim, "day=009")


def test_mismatched_truth_is_a_clear_error(sim, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(sim, bad)
    tf = bad / "truth" / "day=000" / "part-00000.parquet"
    t = pq.read_table(tf)
    ids = t["example_id"].to_numpy().copy()
    ids[5] = -1
    pq.write_table(t.set_column(0, "example_id", __import__("pyarrow").array(ids)), tf)
    with pytest.raises(DatasetError, match="example_id differs .* row 5"):
        oracle_ne(bad)
    tf.unlink()
    with pytest.raises(DatasetError, match="no truth file"):
        oracle_ne(bad)


def test_pooled_by_task_sums_surfaces():
    acc, both = NEAccumulator(), NEAccumulator()
    rng = np.random.default_rng(0)
    for surface in ("feed", "video"):
        p, y = rng.uniform(0.05, 0.95, 50), (rng.uniform(size=50) < 0.3).astype(np.float64)
        acc.update(f"{surface}/click", p, y)
        both.update("all/click", p, y)
    assert acc.pooled_by_task().results() == pytest.approx(both.results())
