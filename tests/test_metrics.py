import math

import numpy as np
import pytest
import torch

from opengem.metrics import MetricAccumulator, auc, calibration, entropy, log_loss, normalized_entropy


def brute_force_auc(p, y):
    pos = [a for a, b in zip(p, y) if b == 1]
    neg = [a for a, b in zip(p, y) if b == 0]
    wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg)
    return wins / (len(pos) * len(neg))


def test_auc_matches_pair_counting_with_ties():
    rng = np.random.default_rng(0)
    for trial in range(20):
        n = int(rng.integers(2, 40))
        p = rng.integers(0, 5, n) / 4.0  # few distinct values: many ties
        y = rng.integers(0, 2, n)
        if y.min() == y.max():
            continue
        assert auc(p, y) == pytest.approx(brute_force_auc(p, y), abs=1e-12), trial


def test_auc_hand_values():
    assert auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert auc([0.5, 0.5], [0, 1]) == pytest.approx(0.5)
    assert auc([0.9, 0.1], [0, 1]) == pytest.approx(0.0)
    assert math.isnan(auc([0.2, 0.3], [1, 1]))


def test_ne_hand_values():
    y = np.array([1, 0, 0, 0])
    p = np.array([0.5, 0.5, 0.5, 0.5])
    # log loss of constant 0.5 is ln 2; entropy of rate 0.25
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert log_loss(p, y) == pytest.approx(math.log(2))
    assert entropy(0.25) == pytest.approx(h)
    assert normalized_entropy(p, y) == pytest.approx(math.log(2) / h)
    # predicting the base rate itself gives NE exactly 1
    assert normalized_entropy(np.full(4, 0.25), y) == pytest.approx(1.0)
    # a better-than-base-rate model is below 1
    assert normalized_entropy(np.array([0.9, 0.1, 0.1, 0.1]), y) < 0.5
    assert math.isnan(normalized_entropy(p, np.zeros(4)))


def test_calibration():
    assert calibration(np.array([0.2, 0.2, 0.2, 0.2]), np.array([1, 0, 0, 0])) == pytest.approx(0.8)


def test_accumulator_per_surface_task_streams_and_masks():
    acc = MetricAccumulator(["a", "b"], ["click", "conv"])
    rng = np.random.default_rng(1)
    P, Y, M, S = [], [], [], []
    for _ in range(3):  # three batches
        B = 50
        p = torch.tensor(rng.random((B, 2)), dtype=torch.float32)
        y = torch.tensor(rng.random((B, 2)) < p.numpy(), dtype=torch.float32)
        m = torch.tensor(rng.random((B, 2)) < 0.8)
        s = torch.tensor(rng.integers(0, 2, B))
        acc.update(p, y, m, s)
        P.append(p.numpy()), Y.append(y.numpy()), M.append(m.numpy()), S.append(s.numpy())
    P, Y, M, S = map(np.concatenate, (P, Y, M, S))
    out = acc.compute()
    assert set(out) == {"a/click", "a/conv", "b/click", "b/conv", "all/click", "all/conv"}
    sel = (S == 1) & M[:, 1]
    r = out["b/conv"]
    assert r["rows"] == int(sel.sum())
    assert r["base_rate"] == pytest.approx(Y[sel, 1].mean())
    assert r["auc"] == pytest.approx(brute_force_auc(P[sel, 1], Y[sel, 1]))
    assert r["ne"] == pytest.approx(normalized_entropy(P[sel, 1], Y[sel, 1]), rel=1e-6)
    assert out["all/click"]["rows"] == int(M[:, 0].sum())


def test_accumulator_rejects_bad_shapes():
    acc = MetricAccumulator(["a"], ["click"])
    with pytest.raises(ValueError, match="task columns"):
        acc.update(torch.zeros(3, 2), torch.zeros(3, 2), torch.ones(3, 2, dtype=torch.bool), torch.zeros(3))
    with pytest.raises(ValueError, match="surface index"):
        acc.update(torch.zeros(3, 1), torch.zeros(3, 1), torch.ones(3, 1, dtype=torch.bool),
                   torch.tensor([0, 1, 0]))


def test_accumulator_state_merge_equals_one_accumulator():
    """Gathering across ranks goes through state()/merge(), never the private fields."""
    g = torch.Generator().manual_seed(0)
    p, y = torch.rand(40, 2, generator=g), (torch.rand(40, 2, generator=g) < 0.4).float()
    m, s = torch.rand(40, 2, generator=g) < 0.8, torch.randint(0, 3, (40,), generator=g)
    whole = MetricAccumulator(["a", "b", "c"], ["click", "conv"])
    whole.update(p, y, m, s)
    left, right = MetricAccumulator(["a", "b", "c"], ["click", "conv"]), MetricAccumulator(
        ["a", "b", "c"], ["click", "conv"])
    left.update(p[:25], y[:25], m[:25], s[:25])
    right.update(p[25:], y[25:], m[25:], s[25:])
    left.merge(right.state())
    assert left.compute() == whole.compute()
