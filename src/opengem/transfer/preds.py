"""Per-example predictions of an arm as numpy arrays: concatenating windows, aligning rows by example id."""

from __future__ import annotations

from typing import Any

import numpy as np


def concat_preds(preds: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    return {k: np.concatenate([p[k] for p in preds]) for k in preds[0]}


def align_rows(ref: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Index into ``other`` for each id of ``ref`` (the same rows, possibly another order)."""
    order = np.argsort(other)
    pos = order[np.searchsorted(other[order], ref)]
    if not np.array_equal(other[pos], ref):
        raise RuntimeError("arms were evaluated on different rows (a loader or dataset mismatch)")
    return pos


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-np.clip(x, -30, 30)))
