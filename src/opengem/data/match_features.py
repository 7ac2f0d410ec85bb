"""Counting features of a user's history against the ranked item: how often the history holds the item's id.

Counts of a user's past interactions with the ad, its advertiser or its category being ranked are among the
most common inputs of production click models (retargeting is a large share of ads revenue). A model can
in principle learn them from ids alone, by matching the item's embedding against the history's through
attention or dot products, but equality of ids comes through narrow random embeddings slowly: on a log whose
only signal is "the ad is in the user's history" (session 39, ``benchmarks/results/2026-12-06-s39/own_data/``)
no family learned anything from 160,000 rows. These features hand every family the counts.

Declared in the schema (``match_features``): each names a sequence group's id field and a single-valued sparse
feature on the *same table*, so that equal ids are the same value, and a window ``recent``. Each gives two
dense inputs, derived inside ``parquet.to_batch`` like the time features (the loader's and the serving
Predictor's one path, so a model never sees them computed two ways):

- ``match_<group>_<field>_count``: log1p of the number of the row's events whose id equals the feature's;
- ``match_<group>_<field>_recent<k>``: the share of the row's latest min(k, length) events that equal it
  (histories are oldest first; 0 for an empty history).

Id 0 (missing, or out of vocabulary) never matches: it is not a value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MatchFeature:
    sequence: str
    field: str
    feature: str
    recent: int = 8

    @property
    def names(self) -> list[str]:
        stem = f"match_{self.sequence}_{self.field}"
        return [f"{stem}_count", f"{stem}_recent{self.recent}"]


def match_feature_names(features: tuple[MatchFeature, ...] | list[MatchFeature]) -> list[str]:
    """The dense input names of ``features``, in the order :func:`match_feature_values` writes them."""
    return [name for m in features for name in m.names]


def first_values(lengths: np.ndarray, values: np.ndarray) -> np.ndarray:
    """[n] int64: each row's first value of a jagged column (0 where the row has none)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    out = np.zeros(len(lengths), dtype=np.int64)
    has = lengths > 0
    starts = np.cumsum(lengths) - lengths
    out[has] = np.asarray(values, dtype=np.int64)[starts[has]]
    return out


def match_feature_values(lengths: np.ndarray, values: np.ndarray, target: np.ndarray,
                         recent: int) -> np.ndarray:
    """[n, 2] float32: log1p(matches) and the share of matches among the latest min(recent, length) events,
    for the jagged history (``lengths``, ``values``, oldest first) of each row against ``target`` [n]."""
    lengths = np.asarray(lengths, dtype=np.int64)
    values = np.asarray(values, dtype=np.int64)
    target = np.asarray(target, dtype=np.int64)
    n = len(lengths)
    row = np.repeat(np.arange(n), lengths)
    hit = (values == target[row]) & (values != 0)
    ends = np.cumsum(lengths)
    from_end = ends[row] - 1 - np.arange(len(values))  # 0 = the row's latest event
    count = np.bincount(row[hit], minlength=n)
    latest = np.bincount(row[hit & (from_end < recent)], minlength=n)
    out = np.empty((n, 2), dtype=np.float32)
    out[:, 0] = np.log1p(count)
    out[:, 1] = latest / np.maximum(np.minimum(lengths, recent), 1)
    return out
