"""Matplotlib (Agg) figures for ``opengem report``, each returned as PNG bytes to embed inline.

Every function takes plain Python data (series keyed by a label), so the page code decides what to
compare (keys of one run, or runs side by side) and the plots stay the same for both.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")  # no display, no server: the report must render anywhere
import matplotlib.pyplot as plt  # noqa: E402

Series = Mapping[str, tuple[Sequence[float], Sequence[float]]]  # label -> (x, y)

_SIZE = (7.5, 3.6)
_DPI = 90


def _png(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=_DPI)
    plt.close(fig)
    return buf.getvalue()


def line_plot(series: Series, title: str, xlabel: str, ylabel: str, hline: float | None = None,
              logy: bool = False) -> bytes:
    """Curves over steps; single points get a marker so a one-eval run is still visible."""
    fig, ax = plt.subplots(figsize=_SIZE)
    for label, (x, y) in series.items():
        ax.plot(list(x), list(y), marker="o" if len(x) <= 12 else None, ms=4, label=label)
    if hline is not None:
        ax.axhline(hline, color="grey", ls="--", lw=1)
    if logy:
        ax.set_yscale("log")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=8, ncol=2 if len(series) > 6 else 1)
    return _png(fig)


def grouped_bars(groups: Sequence[str], bars: Mapping[str, Sequence[float | None]], title: str,
                 ylabel: str, hline: float | None = None) -> bytes:
    """One group per surface/task, one bar per run (or one series): e.g. calibration ratio, ideal 1.0."""
    fig, ax = plt.subplots(figsize=(max(_SIZE[0], 0.9 * len(groups) * max(1, len(bars)) ** 0.5), _SIZE[1]))
    n = max(1, len(bars))
    width = 0.8 / n
    for i, (label, values) in enumerate(bars.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        ys = [float("nan") if v is None else v for v in values]
        ax.bar(xs, ys, width=width, label=label)
    if hline is not None:
        ax.axhline(hline, color="grey", ls="--", lw=1)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=30, ha="right", fontsize=8)
    ax.set(title=title, ylabel=ylabel)
    ax.grid(alpha=0.3, axis="y")
    if len(bars) > 1:
        ax.legend(fontsize=8)
    return _png(fig)


def reliability_plot(curves: Mapping[str, tuple[Sequence[float], Sequence[float]]], title: str) -> bytes:
    """Observed rate vs mean prediction per bin on log-log axes (CTRs are small); the diagonal is ideal."""
    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    lo, hi = 1.0, 0.0
    for label, (pred, obs) in curves.items():
        pts = [(p, o) for p, o in zip(pred, obs, strict=True) if p > 0 and o > 0]
        if not pts:
            continue
        xs, ys = zip(*pts, strict=True)
        lo, hi = min(lo, *xs, *ys), max(hi, *xs, *ys)
        ax.plot(xs, ys, marker="o", ms=3, label=label)
    if hi > lo:
        ax.plot([lo, hi], [lo, hi], color="grey", ls="--", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set(title=title, xlabel="mean predicted probability", ylabel="observed rate")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _png(fig)
