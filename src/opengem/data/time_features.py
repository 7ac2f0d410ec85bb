"""Time-of-request context features: the hour of the day and the day of the week as (sin, cos) pairs.

Click and conversion rates follow the clock (people browse in the evening, messaging peaks at night, the
weekend differs from Monday); the simulator models this with a daily cycle on every surface and, when
``weekly_rate_amp`` > 0, a weekly one. A model that does not see the time has to predict the day's average
rate at every hour, so its predictions / observed rate swing with the cycle's phase. Real ranking systems
feed the request time as a context feature; these are those features.

They are derived from the schema's time column inside ``parquet.to_batch`` -- the one encoding path of the
loader and the serving Predictor -- so a model never sees them computed two ways. Each is a point on the
unit circle, (sin 2 pi p, cos 2 pi p) for the phase p in [0, 1), because the clock is circular: 23:59 is
next to 00:00, which a linear "hour / 24" value hides. A fixed time-zone offset (KuaiRand logs Beijing time,
the simulator UTC) only rotates the pair, which a model's first linear layer absorbs, so the phases are
computed in UTC and no time zone is declared.

Phases (``ts`` in the schema's ``time_unit`` since the Unix epoch, UTC):
- ``hour_of_day``: seconds since midnight / 86400 (continuous: 06:00 is 0.25, 12:00 is 0.5);
- ``day_of_week``: seconds since Monday 00:00 / 604800 (1970-01-01 was a Thursday, so Monday 1970-01-05
  00:00 is phase 0; Thursday 00:00 is 3/7).
"""

from __future__ import annotations

import numpy as np

TIME_FEATURES = ("hour_of_day", "day_of_week")
TIME_UNITS = {"s": 1, "ms": 1_000, "us": 1_000_000}  # name -> ticks per second
DAY_S = 86_400
WEEK_S = 7 * DAY_S
MONDAY_S = 4 * DAY_S  # 1970-01-05 00:00 UTC, the first Monday after the Unix epoch

_PERIOD_S = {"hour_of_day": (DAY_S, 0), "day_of_week": (WEEK_S, MONDAY_S)}  # period and phase-0 instant


def time_feature_names(features: tuple[str, ...] | list[str]) -> list[str]:
    """The dense input names of ``features``, in the order :func:`time_feature_values` writes them."""
    return [f"{f}_{part}" for f in features for part in ("sin", "cos")]


def time_phase(ts: np.ndarray, feature: str, unit: str = "s") -> np.ndarray:
    """[n] float64 phase in [0, 1) of each timestamp in the cycle of ``feature``.

    The remainder is taken in integer ticks, so a millisecond timestamp of 2022 (~1.65e12) keeps its
    precision (a float64 of it would be exact too, but float32 would not)."""
    period_s, zero_s = _PERIOD_S[feature]
    per_s = TIME_UNITS[unit]
    ticks = np.mod(np.asarray(ts, dtype=np.int64) - zero_s * per_s, period_s * per_s)
    return ticks.astype(np.float64) / float(period_s * per_s)


def time_feature_values(ts: np.ndarray, features: tuple[str, ...] | list[str], unit: str = "s") -> np.ndarray:
    """[n, 2 * len(features)] float32: (sin, cos) of each feature's phase, features in the given order."""
    n = len(ts)
    out = np.empty((n, 2 * len(features)), dtype=np.float32)
    for i, f in enumerate(features):
        angle = 2.0 * np.pi * time_phase(ts, f, unit)
        out[:, 2 * i] = np.sin(angle)
        out[:, 2 * i + 1] = np.cos(angle)
    return out
