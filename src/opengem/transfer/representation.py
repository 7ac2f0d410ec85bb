"""Representation transfer: FM embeddings as VM input features.

The embeddings come from the side table (``generate``), so they are stop-gradient into the FM by
construction. Two details matter for a VM that trains across FM refreshes:

- normalisation across versions: each FM version has its own embedding space scale and offset, so each
  dimension is standardised per version (mean 0, std 1 over the rows that version produced);
- history aggregation excludes the current example: ``history_mean`` averages an embedding over the
  same user's strictly earlier examples, never the row being predicted (that would leak its own FM
  view into the aggregate and inflate offline gains).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def _matrix(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """list<float> column -> [N, D]; empty lists (no FM version) -> zero rows."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    lens = pc.fill_null(pc.list_value_length(arr), 0).to_numpy()
    width = int(lens.max()) if lens.size else 0
    out = np.zeros((len(arr), width), dtype=np.float32)
    if width == 0:
        return out
    if np.any((lens != 0) & (lens != width)):
        raise ValueError(f"FM embedding column has rows of widths {sorted(set(lens.tolist()))}, expected one")
    full = lens == width
    out[full] = arr.filter(pa.array(full)).flatten().to_numpy(zero_copy_only=False).reshape(-1, width)
    return out


def embedding_lookup(side: pa.Table, names: list[str], normalize: bool = True) -> dict[str, np.ndarray]:
    """{"example_id": sorted ids, name: [N, D] per-version standardised} from a side table."""
    ids = side.column("example_id").to_numpy()
    order = np.argsort(ids, kind="stable")
    out: dict[str, np.ndarray] = {"example_id": ids[order]}
    ver = side.column("fm_version").to_numpy()[order]
    for name in names:
        if f"fm_{name}" not in side.column_names:
            raise ValueError(f"side table has no column fm_{name} (has {side.column_names})")
        mat = _matrix(side.column(f"fm_{name}"))[order]
        if normalize:
            mat = normalize_per_version(mat, ver)
        out[name] = mat
    return out


def normalize_per_version(mat: np.ndarray, version: np.ndarray) -> np.ndarray:
    out = np.zeros_like(mat)
    for v in np.unique(version[version >= 0]):
        rows = version == v
        mu = mat[rows].mean(0)
        sd = mat[rows].std(0) + 1e-6
        out[rows] = (mat[rows] - mu) / sd
    return out


def history_mean(user: np.ndarray, ts: np.ndarray, example_id: np.ndarray, emb: np.ndarray) -> np.ndarray:
    """Per row: the mean of ``emb`` over the same user's strictly earlier rows (zeros for the first).

    Order is (ts, example_id), so rows with equal ts are ordered by id and a row never sees itself.
    """
    n = len(user)
    order = np.lexsort((example_id, ts, user))
    u = user[order]
    e = emb[order].astype(np.float64)
    csum = np.cumsum(e, axis=0)
    start = np.r_[True, u[1:] != u[:-1]]
    group_start = np.maximum.accumulate(np.where(start, np.arange(n), 0))
    before = csum - e  # inclusive cumsum minus self = sum of rows strictly before, from the table start
    base = np.where(group_start[:, None] > 0, csum[np.maximum(group_start - 1, 0)], 0.0)
    prev_sum = before - base
    count = (np.arange(n) - group_start)[:, None]
    mean = np.where(count > 0, prev_sum / np.maximum(count, 1), 0.0)
    out = np.empty_like(mean)
    out[order] = mean
    return out.astype(np.float32)
