"""Scaling-law fits, their inverses, compute-efficiency ratios and Spearman rank correlation (numpy only).

The law is ``NE(C) = a * C^-b + c``: ``c`` is the NE the family would reach with unlimited compute, which
can never lie below the data's oracle NE (the floor no model beats), and ``a * C^-b`` is the reducible part.
Fitting uses variable projection: for a fixed ``c`` the law is a straight line in
``log(NE - c)`` vs ``log C``, solved exactly by least squares; the remaining one-dimensional search over
``c`` (a grid, then golden-section refinement) minimises the squared error in NE itself, so points are
weighted by how far they miss in NE, not in log space. That needs no scipy and cannot diverge. With a
known floor and ``c`` fixed to it, the fit is the plain log-linear fit on ``NE - floor``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass
class PowerLaw:
    """``y = a * x^-b + c``, fitted on ``n`` points with RMSE ``rmse`` (in y units)."""

    a: float
    b: float
    c: float
    rmse: float
    n: int
    c_fixed: bool = False

    def __call__(self, x: np.ndarray | float) -> np.ndarray | float:
        return self.a * np.power(np.asarray(x, dtype=np.float64), -self.b) + self.c

    @property
    def decreasing(self) -> bool:
        return self.a > 0 and self.b > 0

    def inverse(self, y: float) -> float:
        """The x at which the law reaches ``y``; inf when y is at or below its asymptote ``c``."""
        if not self.decreasing:
            raise ValueError("power law does not decrease with x (b <= 0 or a <= 0): no inverse")
        if y <= self.c:
            return math.inf
        log_x = -math.log((y - self.c) / self.a) / self.b  # in logs: a flat law can need 10^400 FLOPs
        return math.exp(log_x) if log_x < 700 else math.inf

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _loglinear(lx: np.ndarray, y: np.ndarray, c: float) -> tuple[float, float, float]:
    """(log a', b, SSE in y) for a fixed c, x already log-centred."""
    ly = np.log(y - c)
    A = np.stack([np.ones_like(lx), -lx], axis=1)
    (la, b), *_ = np.linalg.lstsq(A, ly, rcond=None)
    pred = np.exp(la - b * lx) + c
    return float(la), float(b), float(np.sum((pred - y) ** 2))


def fit_power_law(x: Sequence[float], y: Sequence[float], c: float | None = None,
                  c_min: float | None = None, grid: int = 400) -> PowerLaw:
    """Least-squares fit of ``y = a x^-b + c``.

    ``c`` given: fixed asymptote (log-linear fit on ``y - c``). Otherwise ``c`` is searched in
    ``[c_min, min(y))`` (``c_min`` defaults to 0: NE is never negative; pass the oracle floor).
    Needs 2 points with ``c`` fixed, 3 otherwise.
    """
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    if xa.shape != ya.shape or xa.ndim != 1:
        raise ValueError(f"fit_power_law: x and y must be 1-D of equal length (got {xa.shape}, {ya.shape})")
    ok = np.isfinite(xa) & np.isfinite(ya) & (xa > 0)
    xa, ya = xa[ok], ya[ok]
    need = 2 if c is not None else 3
    if xa.size < need or np.unique(xa).size < 2:
        raise ValueError(f"fit_power_law: need >= {need} finite points with distinct x > 0 (got {xa.size})")
    x0 = float(np.exp(np.mean(np.log(xa))))  # centre log x: a' is O(1), conditioning stays good
    lx = np.log(xa / x0)
    ymin = float(ya.min())
    if c is not None:
        if ymin <= c:
            raise ValueError(f"fit_power_law: every y must exceed the fixed c={c} (min y {ymin})")
        la, b, sse = _loglinear(lx, ya, c)
        return PowerLaw(math.exp(la) * x0**b, b, float(c), math.sqrt(sse / xa.size), int(xa.size), True)

    lo = 0.0 if c_min is None else float(c_min)
    span = max(float(ya.max()) - ymin, 1e-12)
    hi = ymin - 1e-9 * span
    if lo >= hi:  # every point is at (or below) the floor: only a fixed-c fit just under them makes sense
        lo = ymin - span
    # the distance to the asymptote spans decades: search c on a log scale of (ymin - c)
    gaps = np.geomspace(ymin - lo, ymin - hi, grid)
    cs = ymin - gaps
    sses = np.array([_loglinear(lx, ya, cc)[2] for cc in cs])
    i = int(np.argmin(sses))
    g_lo, g_hi = math.log(gaps[max(i - 1, 0)]), math.log(gaps[min(i + 1, grid - 1)])
    phi = (math.sqrt(5) - 1) / 2

    def f(lg: float) -> float:
        return _loglinear(lx, ya, ymin - math.exp(lg))[2]

    a_, b_ = g_lo, g_hi
    for _ in range(100):  # golden section on log(gap) between the grid neighbours of the best point
        m1, m2 = b_ - phi * (b_ - a_), a_ + phi * (b_ - a_)
        if f(m1) > f(m2):
            a_ = m1
        else:
            b_ = m2
    best_c = ymin - math.exp((a_ + b_) / 2)
    if f(math.log(ymin - best_c)) > sses[i]:
        best_c = float(cs[i])
    la, b, sse = _loglinear(lx, ya, best_c)
    return PowerLaw(math.exp(la) * x0**b, b, float(best_c), math.sqrt(sse / xa.size), int(xa.size))


def efficiency_ratios(ref: PowerLaw, ref_x: Sequence[float], other: PowerLaw,
                      other_x_range: tuple[float, float]) -> list[dict[str, Any]]:
    """At each reference size x: the x the other family needs to reach the reference's fitted NE, over x.

    ``extrapolated`` says the needed x lies outside the other family's measured range (the fitted curve,
    not a measurement, says how much it needs); ``reachable`` False means the other family's asymptote is
    above the reference's NE there (no amount of compute gets it there, per its fit).
    """
    lo, hi = other_x_range
    rows = []
    for x in ref_x:
        y = float(ref(x))
        row: dict[str, Any] = {"x": float(x), "ne": y}
        if not other.decreasing:
            row.update(needed_x=None, ratio=None, reachable=None, extrapolated=None,
                       note="other family's fit does not decrease with compute")
        else:
            need = other.inverse(y)
            reachable = math.isfinite(need)
            row.update(needed_x=need if reachable else None, ratio=need / x if reachable else None,
                       reachable=reachable, extrapolated=(not reachable) or not (lo <= need <= hi))
        rows.append(row)
    return rows


def rankdata(v: Sequence[float]) -> np.ndarray:
    """1-based ranks, ties sharing their average rank."""
    a = np.asarray(v, dtype=np.float64)
    order = np.argsort(a, kind="mergesort")
    s = a[order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    ends = np.r_[starts[1:], s.size]
    ranks = np.empty(a.size)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return ranks


def spearman(u: Sequence[float], v: Sequence[float]) -> float:
    """Spearman rank correlation (Pearson correlation of average ranks); NaN when either is constant."""
    if len(u) != len(v):
        raise ValueError(f"spearman: {len(u)} vs {len(v)} values")
    if len(u) < 2:
        return float("nan")
    ru, rv = rankdata(u), rankdata(v)
    ru, rv = ru - ru.mean(), rv - rv.mean()
    den = math.sqrt(float((ru**2).sum() * (rv**2).sum()))
    return float((ru * rv).sum() / den) if den > 0 else float("nan")


# two-sided 95 % Student t quantiles (t_0.975) for 1..30 degrees of freedom; beyond 30 the normal 1.96 is
# within 2 % (a table instead of scipy, which opengem does not otherwise need)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t975(df: int) -> float:
    """The 97.5 % quantile of Student's t with ``df`` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"t975: need df >= 1 (got {df})")
    return _T975[df - 1] if df <= len(_T975) else 1.96


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of its 95 % t interval); the half-width is NaN for a single value.

    Seeds are few (3-5), so the t quantile, not 1.96: with 3 seeds the interval is 2.2x wider than a
    normal one would claim.
    """
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return float("nan"), float("nan")
    if v.size == 1:
        return float(v[0]), float("nan")
    return float(v.mean()), t975(v.size - 1) * float(v.std(ddof=1)) / math.sqrt(v.size)


def percentile_interval(samples: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Central bootstrap percentile interval; infinite samples (an unreachable NE) sort last, so the upper
    end is inf when more than (1 - level) / 2 of the resamples never reach it."""
    s = np.sort(np.asarray(samples, dtype=np.float64))
    s = s[~np.isnan(s)]
    if s.size == 0:
        return float("nan"), float("nan")
    lo_q, hi_q = (1 - level) / 2, 1 - (1 - level) / 2
    return float(np.quantile(s, lo_q, method="lower")), float(np.quantile(s, hi_q, method="higher"))
