"""NE, AUC and calibration per surface x task, accumulated over batches.

NE (normalized entropy, He et al. 2014) is the log loss divided by the entropy of the base rate, so a
model that only knows the base rate scores 1.0 and lower is better. Which base rate matters: here it is
the empirical positive rate of the very rows being evaluated, for that surface x task (the strictest
choice: a model cannot look good merely because the base rate drifted since training).

AUC is exact (rank statistic with average ranks for ties), so predictions are kept per key; that costs
16 bytes per row and key, fine up to a few million rows.

Calibration (mean prediction / observed rate) comes with a 95 % interval from label noise alone
(``calibration_lo``/``calibration_hi``): a surface x task with 16 conversions has an observed rate that is
itself +-50 % uncertain, so a perfectly calibrated model can read 0.8 there. A cell is miscalibrated only
when its interval excludes 1.0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

EPS = 1e-7
NE_BASE_RATE = (
    "NE = mean log loss / entropy of the base rate, where the base rate is the empirical positive rate "
    "of the evaluated rows of that surface x task (for 'all/<task>': of all evaluated rows with that task)"
)


def log_loss(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(np.asarray(p, dtype=np.float64), EPS, 1 - EPS)
    y = np.asarray(y, dtype=np.float64)
    if p.size == 0:
        return float("nan")
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def entropy(rate: float) -> float:
    """Binary entropy in nats; 0 at rate 0 or 1 (where NE is undefined)."""
    if rate <= 0 or rate >= 1:
        return 0.0
    return -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))


def normalized_entropy(p: np.ndarray, y: np.ndarray) -> float:
    """Log loss over the entropy of the rows' own positive rate; NaN when that rate is 0 or 1."""
    y = np.asarray(y, dtype=np.float64)
    if y.size == 0:
        return float("nan")
    h = entropy(float(y.mean()))
    return log_loss(p, y) / h if h > 0 else float("nan")


def auc(p: np.ndarray, y: np.ndarray) -> float:
    """Exact ROC AUC: P(score of a random positive > a random negative), ties counting one half."""
    p = np.asarray(p, dtype=np.float64)
    pos = np.asarray(y, dtype=np.float64) > 0.5
    n_pos = int(pos.sum())
    n_neg = int(pos.size - n_pos)
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(p, kind="mergesort")
    sp = p[order]
    # average 1-based rank of each run of equal scores
    starts = np.flatnonzero(np.r_[True, sp[1:] != sp[:-1]])
    ends = np.r_[starts[1:], sp.size]
    avg_rank = (starts + ends + 1) / 2.0
    ranks = np.empty(sp.size, dtype=np.float64)
    ranks[order] = np.repeat(avg_rank, ends - starts)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def calibration(p: np.ndarray, y: np.ndarray) -> float:
    """Mean prediction over observed rate (1.0 = calibrated); NaN without positives."""
    y = np.asarray(y, dtype=np.float64)
    if y.size == 0 or y.sum() == 0:
        return float("nan")
    return float(np.mean(p) / np.mean(y))


def wilson_interval(positives: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial rate (Wilson 1927): unlike rate +- z*se it stays inside [0, 1]
    and is not degenerate at a handful of positives, which is where calibration needs it."""
    if n <= 0:
        return float("nan"), float("nan")
    r = positives / n
    centre = (r + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(r * (1 - r) / n + z * z / (4 * n * n))
    return max(centre - half, 0.0), min(centre + half, 1.0)


def calibration_interval(p: np.ndarray, y: np.ndarray, z: float = 1.96) -> tuple[float, float]:
    """(lo, hi) of mean prediction / observed rate when only the labels are noisy: mean(p) over the
    Wilson interval of the observed rate. Conservative for a model (it treats every row as having the base
    rate; rows of different probabilities give a narrower interval); NaN where calibration is."""
    y = np.asarray(y, dtype=np.float64)
    k = int(round(float(y.sum())))
    if y.size == 0 or k == 0:
        return float("nan"), float("nan")
    lo_rate, hi_rate = wilson_interval(k, int(y.size), z)
    mean_p = float(np.mean(p))
    return mean_p / hi_rate, (mean_p / lo_rate if lo_rate > 0 else float("inf"))


def summarize(p: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    y = np.asarray(y, dtype=np.float64)
    cal_lo, cal_hi = calibration_interval(p, y)
    return {
        "ne": _finite(normalized_entropy(p, y)),
        "auc": _finite(auc(p, y)),
        "calibration": _finite(calibration(p, y)),
        "calibration_lo": _finite(cal_lo),  # 95 % interval from label noise (see calibration_interval)
        "calibration_hi": _finite(cal_hi),
        "log_loss": _finite(log_loss(p, y)),
        "rows": int(y.size),
        "base_rate": _finite(float(y.mean())) if y.size else None,
    }


def _finite(x: float) -> float | None:
    """JSON has no NaN: undefined metrics are None."""
    return None if x is None or not math.isfinite(x) else float(x)


class MetricAccumulator:
    """Collects (prediction, label) pairs per surface x task over batches; ``compute`` gives the metrics.

    Keys are ``"<surface>/<task>"`` plus ``"all/<task>"`` over every surface. Only observed labels
    (mask True) count.
    """

    def __init__(self, surfaces: Sequence[str], tasks: Sequence[str]) -> None:
        self.surfaces = list(surfaces)
        self.tasks = list(tasks)
        self._p: dict[tuple[int, int], list[np.ndarray]] = {}
        self._y: dict[tuple[int, int], list[np.ndarray]] = {}

    def update(self, probs: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor,
               surface: torch.Tensor) -> None:
        """probs/labels/mask: [B, T] (probabilities, not logits); surface: [B] indices into surfaces."""
        if probs.shape != labels.shape or probs.shape != mask.shape:
            raise ValueError(f"metrics: shapes differ: probs {tuple(probs.shape)}, labels "
                             f"{tuple(labels.shape)}, mask {tuple(mask.shape)}")
        if probs.shape[1] != len(self.tasks):
            raise ValueError(f"metrics: {probs.shape[1]} task columns, expected {len(self.tasks)}")
        p = probs.detach().float().cpu().numpy()
        y = labels.detach().float().cpu().numpy()
        m = mask.detach().bool().cpu().numpy()
        s = surface.detach().cpu().numpy()
        if s.size and (s.min() < 0 or s.max() >= len(self.surfaces)):
            raise ValueError(f"metrics: surface index out of range [0, {len(self.surfaces)})")
        for si in np.unique(s):
            rows = s == si
            for ti in range(len(self.tasks)):
                sel = rows & m[:, ti]
                if sel.any():
                    self._p.setdefault((int(si), ti), []).append(p[sel, ti])
                    self._y.setdefault((int(si), ti), []).append(y[sel, ti])

    def state(self) -> dict[tuple[int, int], tuple[list[np.ndarray], list[np.ndarray]]]:
        """What was collected, per (surface, task): picklable, for gathering across ranks."""
        return {k: (self._p[k], self._y[k]) for k in self._p}

    def merge(self, state: dict[tuple[int, int], tuple[list[np.ndarray], list[np.ndarray]]]) -> None:
        """Add another accumulator's :meth:`state` (e.g. another rank's) after this one's pairs."""
        for k, (ps, ys) in state.items():
            self._p.setdefault(k, []).extend(ps)
            self._y.setdefault(k, []).extend(ys)

    def compute(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for ti, task in enumerate(self.tasks):
            all_p, all_y = [], []
            for si, surf in enumerate(self.surfaces):
                if (si, ti) not in self._p:
                    continue
                p = np.concatenate(self._p[(si, ti)])
                y = np.concatenate(self._y[(si, ti)])
                out[f"{surf}/{task}"] = summarize(p, y)
                all_p.append(p)
                all_y.append(y)
            if all_p:
                out[f"all/{task}"] = summarize(np.concatenate(all_p), np.concatenate(all_y))
        return out
