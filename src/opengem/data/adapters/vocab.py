"""Streaming encoders fitted on the training split: categorical vocabularies and dense statistics.

Id layout of every categorical feature the generic importer writes: **0 is the feature's
out-of-vocabulary (OOV) row**, used by missing values, by values seen fewer than ``min_count`` times in
train and by values never seen in train. Because rare training values also land on it, training rows
update row 0, so a valid/test value the model never saw gets a *trained* embedding (the "unknown"
row of a vocabulary that only unseen values use is never trained and stays at its random
initialisation). Kept values get ids ``1..K`` in sorted order.

A feature with more than ``hash_buckets`` kept values (or one whose distinct values outgrow the
counting cap, so that pass 1 stays within bounded memory) is hashed instead: a stable hash of the
value (splitmix64 for integers, CRC32 for strings: identical across runs and machines) picks a bucket
in ``1..hash_buckets-1``; missing values use row 0. Unseen values share buckets with training values,
so they too get trained rows.

Counting is streaming: per-batch ``value_counts`` merged with Arrow's group-by, never a Python dict
per value; encoding is ``pyarrow.compute.index_in`` against the kept values.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from opengem.data.adapters.common import AdapterError

COUNT_CAP_FACTOR = 4  # stop counting (and hash) once distinct values exceed this many times hash_buckets
# per-batch value counts wait in a list until they total this many rows (or 2 x hash_buckets), then are
# merged by one group-by: a bounded buffer per feature that amortises the merge
MERGE_ROWS = 131_072


def splitmix64(x: np.ndarray) -> np.ndarray:
    """A fixed integer hash (no RNG state, identical across numpy versions)."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def flat_values(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The values of a scalar column, or the elements of a list column, as one array."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        arr = pc.list_flatten(arr)
    return arr


def split_cells(arr: pa.Array | pa.ChunkedArray, separator: str) -> pa.ListArray:
    """A column whose cells hold lists joined by ``separator`` ("12^7^5") as a list<string> column: each
    value trimmed of white space, empty values dropped (an empty or missing cell is an empty list)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    lists = pc.split_pattern(pc.fill_null(pc.cast(arr, pa.string()), ""), pattern=separator)
    flat = pc.utf8_trim_whitespace(pc.list_flatten(lists))
    keep = pc.not_equal(flat, "").to_numpy(zero_copy_only=False)
    parent = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
    counts = np.bincount(parent[keep], minlength=len(arr))
    offsets = np.zeros(len(arr) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), flat.filter(pa.array(keep)))


def _is_pad(col: pa.Array, pad: str) -> pa.Array:
    """Which cells of ``col`` are the filler ``pad``: by value in a numeric column (a float column writes
    the filler 0 as 0.0, which the text "0" would miss), by trimmed text otherwise."""
    t = col.type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        none = pa.array(np.zeros(len(col), bool))
        try:
            value = float(pad)
        except ValueError:
            return none  # a text filler is in no numeric cell
        if not pa.types.is_integer(t):
            return pc.equal(pc.cast(col, pa.float64()), value)
        if not value.is_integer():
            return none
        try:
            return pc.equal(col, pa.scalar(int(value), t))
        except (pa.ArrowInvalid, OverflowError):
            return none  # out of the column's range
    return pc.equal(pc.utf8_trim_whitespace(pc.cast(col, pa.string())), pad.strip())


def gather_columns(columns: list[pa.Array], pad: str) -> pa.ListArray:
    """One list per row of the cells of ``columns`` in their order, without empty cells (null or blank) and
    cells equal to ``pad``: a history the log spreads over one column per event. Columns of one type keep
    it; mixed types (a CSV column of empty cells reads as null, its neighbours as integers) are cast to the
    type of the first non-null column, as one history holds values of one type."""
    n, k = len(columns[0]), len(columns)
    kinds = [c.type for c in columns if not pa.types.is_null(c.type)]
    kind = kinds[0] if kinds else pa.string()
    cols = [c if c.type == kind else pc.cast(c, kind) for c in columns]
    keep = np.empty((k, n), dtype=bool)
    for j, c in enumerate(cols):
        ok = c.is_valid()
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            ok = pc.and_(ok, pc.not_equal(pc.utf8_trim_whitespace(c), ""))
        if pad:
            ok = pc.and_(ok, pc.invert(_is_pad(c, pad)))
        keep[j] = ok.fill_null(False).to_numpy(zero_copy_only=False)
    flat = pa.concat_arrays(cols)  # column after column: cell (row i, column j) is flat[j * n + i]
    index = (np.arange(k)[None, :] * n + np.arange(n)[:, None])[keep.T]  # row after row, columns in order
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(keep.sum(axis=0), out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), flat.take(pa.array(index, pa.int64())))


def categorical_key(arr: pa.Array) -> pa.Array:
    """Integers stay int64, everything else becomes strings, so that counting and lookup agree."""
    if pa.types.is_integer(arr.type) or pa.types.is_boolean(arr.type):
        return pc.cast(arr, pa.int64())
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        return pc.cast(arr, pa.string())
    return pc.cast(arr, pa.string())


@dataclass
class CategoryCounter:
    """Counts of a categorical feature's values over the training rows (pass 1)."""

    name: str
    hash_buckets: int
    counts: pa.Table | None = None
    nulls: int = 0
    overflow: bool = False  # too many distinct values to count: the feature will be hashed
    _pending: list[pa.Table] = field(default_factory=list)
    _pending_rows: int = 0

    def update(self, arr: pa.Array) -> None:
        vals = categorical_key(flat_values(arr))
        self.nulls += vals.null_count
        if self.overflow or len(vals) == vals.null_count:
            return
        vc = pc.value_counts(vals.drop_null())
        counts = pc.cast(vc.field("counts"), pa.int64())
        self._pending.append(pa.table({"v": vc.field("values"), "n": counts}))
        self._pending_rows += len(vc)
        if self._pending_rows > max(2 * self.hash_buckets, MERGE_ROWS):
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        parts = ([self.counts] if self.counts is not None else []) + self._pending
        self._pending, self._pending_rows = [], 0
        merged = pa.concat_tables(parts).group_by("v").aggregate([("n", "sum")])
        self.counts = merged.select(["v", "n_sum"]).rename_columns(["v", "n"])
        if self.counts.num_rows > COUNT_CAP_FACTOR * self.hash_buckets:
            self.overflow, self.counts = True, None

    def finish(self, min_count: int, force_hash: bool = False) -> CategoryVocab:
        """The vocabulary: values with at least ``min_count`` training rows, or hashing (see module)."""
        self._merge()
        if self.overflow or force_hash:
            return CategoryVocab(self.name, None, self.hash_buckets, hashed=True)
        if self.counts is None:
            return CategoryVocab(self.name, pa.array([], pa.int64()), 1)
        kept = self.counts.filter(pc.greater_equal(self.counts["n"], min_count))["v"].combine_chunks()
        if len(kept) + 1 > self.hash_buckets:
            return CategoryVocab(self.name, None, self.hash_buckets, hashed=True)
        kept = kept.take(pc.sort_indices(kept))
        return CategoryVocab(self.name, kept, len(kept) + 1)

    @property
    def distinct(self) -> int | None:
        self._merge()
        return None if self.overflow or self.counts is None else self.counts.num_rows


@dataclass
class CategoryVocab:
    """Value -> id for one feature (0 = OOV row; see the module docstring)."""

    name: str
    values: pa.Array | None  # sorted kept values (None when hashed)
    size: int  # rows of the embedding table
    hashed: bool = False
    fixed: bool = False  # the values are already ids in [0, size): kept as they are (missing -> 0)

    def encode_flat(self, arr: pa.Array) -> np.ndarray:
        if self.fixed:
            return self._fixed(arr)
        vals = categorical_key(arr)
        if self.hashed:
            return self._hash(vals)
        if self.values is None or len(self.values) == 0:
            return np.zeros(len(vals), np.int64)
        value_set = self.values if self.values.type == vals.type else pc.cast(self.values, vals.type)
        idx = pc.index_in(vals, value_set=value_set)
        return pc.fill_null(idx, -1).to_numpy(zero_copy_only=False).astype(np.int64) + 1

    def encode(self, arr: pa.Array | pa.ChunkedArray) -> pa.Array:
        """Ids of a scalar column (int64), or of a list column element-wise (list<int64>, null -> [])."""
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
            return pa.array(self.encode_flat(arr), pa.int64())
        arr = pc.fill_null(arr, pa.scalar([], arr.type))
        offsets = pc.subtract(arr.offsets, arr.offsets[0])
        try:
            ids = self.encode_flat(pc.list_flatten(arr))
        except IdOutOfRange as e:  # the value's index -> its row
            row = int(np.searchsorted(offsets.to_numpy(zero_copy_only=False)[1:], e.row, side="right"))
            raise IdOutOfRange(str(e), row) from None
        return pa.ListArray.from_arrays(pc.cast(offsets, pa.int32()), pa.array(ids, pa.int64()))

    def _fixed(self, arr: pa.Array) -> np.ndarray:
        try:
            ids = pc.fill_null(pc.cast(arr, pa.int64()), 0).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise AdapterError(f"column {self.name!r}: declared vocab = {self.size} (ids kept as they are) "
                               f"but holds non-integers: {e}") from None
        bad = (ids < 0) | (ids >= self.size)
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            raise IdOutOfRange(f"column {self.name!r}: id {int(ids[j])} outside the declared vocab "
                               f"[0, {self.size})", j)
        return ids.astype(np.int64)

    def _hash(self, vals: pa.Array) -> np.ndarray:
        out = np.zeros(len(vals), np.int64)
        valid = ~vals.is_null().to_numpy(zero_copy_only=False)
        if not valid.any():
            return out
        buckets = np.uint64(self.size - 1)
        if pa.types.is_integer(vals.type):
            x = vals.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
            h = splitmix64(x.view(np.uint64))
        else:  # hash each distinct string once
            enc = pc.dictionary_encode(vals.fill_null(""))
            uniq = [zlib.crc32(s.encode("utf-8")) for s in enc.dictionary.to_pylist()]
            h = splitmix64(np.asarray(uniq, np.uint64))[enc.indices.to_numpy(zero_copy_only=False)]
        out[valid] = (h[valid] % buckets).astype(np.int64) + 1
        return out


class IdOutOfRange(AdapterError):
    """An id outside a declared vocabulary, with the row (of the column encoded) that holds it."""

    def __init__(self, message: str, row: int) -> None:
        super().__init__(message)
        self.row = row


@dataclass
class DenseStats:
    """Streaming count, mean and variance of a dense feature on the training rows (float64 sums)."""

    n: int = 0
    total: float = 0.0
    total_sq: float = 0.0
    nulls: int = 0

    def update(self, x: np.ndarray) -> None:
        finite = np.isfinite(x)
        self.nulls += int((~finite).sum())
        v = x[finite].astype(np.float64)
        self.n += len(v)
        self.total += float(v.sum())
        self.total_sq += float((v * v).sum())

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else 0.0

    @property
    def std(self) -> float:
        if self.n < 2:
            return 1.0
        var = max(self.total_sq / self.n - self.mean ** 2, 0.0)
        return float(np.sqrt(var)) if var > 1e-12 else 1.0
