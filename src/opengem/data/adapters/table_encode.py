"""Fitting (pass 1) and applying (pass 2) the generic importer's per-column encoders.

Pass 1 sees every row but learns only from the train rows: categorical counts -> vocabularies,
dense mean/std; surfaces come from all rows (a surface is a routing label known up front, not a
learned value). A label column must hold 0/1 (empty = not observed); a bad value names file, column
and row. A derived label (``like=rating>=4``, :mod:`labels`) is computed here, from any number.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from opengem.data.adapters.common import AdapterError, BadRows
from opengem.data.adapters.infer import ImportSpec, SequenceSpec
from opengem.data.adapters.labels import LabelRule
from opengem.data.adapters.vocab import (
    CategoryCounter,
    CategoryVocab,
    DenseStats,
    IdOutOfRange,
    categorical_key,
    gather_columns,
    split_cells,
)
from opengem.data.dataset import arrow_schema
from opengem.data.schema import FeatureSchema

N_SPLITS = 3
MAX_SURFACES = 64


def _floats(col: pa.Array) -> np.ndarray:
    return pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False).astype(np.float64)


FLOAT32_MAX = float(np.finfo(np.float32).max)


def _check_float32_range(chunk: Chunk, name: str, x: np.ndarray) -> None:
    """A dense cell past float32's range (the canonical column's type: it would be stored as inf, and its
    square overflowed the statistics' float64 sums past 1.3e154) is one line naming its place. ``x``: the
    chunk's column ``name`` as float64."""
    with np.errstate(invalid="ignore"):
        big = np.abs(x) > FLOAT32_MAX
    big &= np.isfinite(x)
    if big.any():
        j = int(np.flatnonzero(big)[0])
        raise AdapterError(f"{chunk.place(j)}, column {name!r} (dense): {x[j]:g} is past the range of the "
                           f"float32 values a dense feature is stored as (|x| <= {FLOAT32_MAX:.3g})")


def tail_lists(arr: pa.ListArray, max_len: int) -> pa.ListArray:
    """Keep the last ``max_len`` elements of every list (oldest first, so the most recent survive)."""
    offsets = arr.offsets.to_numpy().astype(np.int64)
    lens = np.diff(offsets)
    if len(lens) == 0 or lens.max() <= max_len:
        return arr
    keep = np.minimum(lens, max_len)
    new = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(keep, out=new[1:])
    idx = np.repeat(offsets[1:] - keep - new[:-1], keep) + np.arange(new[-1])
    values = arr.values.take(pa.array(idx - offsets[0]))
    return pa.ListArray.from_arrays(pa.array(new.astype(np.int32)), values)


def gather_spread_histories(cols: dict[str, Any], spec: ImportSpec, file: Path | str = "") -> bool:
    """In ``cols`` (column name -> array), each history of ``spec`` spread over columns that are all there
    replaced by one list column named after it (gather_columns); the importer's passes and a served request's
    raw rows both go through here. True when any was gathered."""
    gathered = False
    for q in spec.sequence:
        if q.columns and all(c in cols for c in q.columns):
            try:
                cols[q.name] = gather_columns([cols.pop(c) for c in q.columns], q.pad)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise AdapterError(f"{file}: columns {', '.join(q.columns)} (the history {q.name!r}) hold "
                                   f"values of types that do not convert to one another: {e}") from None
            gathered = True
    return gathered


def prepare_lists(batch: pa.RecordBatch, spec: ImportSpec, file: Path | str = "") -> pa.RecordBatch:
    """``batch`` as the encoders read it: each history the log spreads over columns gathered into one list
    column named after it (see gather_columns), every column the spec reads with a ``separator`` split into
    lists (see split_cells), and each history that shares a sparse feature's vocabulary holding values of
    that feature's type (integers stay integers, so that counting, lookup and hashing agree)."""
    if any(q.columns for q in spec.sequence):
        cols = {f.name: batch.column(i) for i, f in enumerate(batch.schema)}
        if gather_spread_histories(cols, spec, file):
            batch = pa.RecordBatch.from_pydict(cols)
    have = set(batch.schema.names)  # a pass may read only some columns (the time pass: one)
    seps = {s.name: s.separator for s in [*spec.sparse, *spec.sequence] if s.separator and s.name in have}
    shared = {q.name: q.share for q in spec.sequence if q.share and {q.name, q.share} <= have}
    if not seps and not shared:
        return batch
    cols = {f.name: batch.column(i) for i, f in enumerate(batch.schema)}
    for name, sep in seps.items():
        cols[name] = split_cells(cols[name], sep)
    for name, share in shared.items():
        want = categorical_key(cols[share][:0]).type
        kind = cols[name].type
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
            raise AdapterError(f"{file}: column {name!r} (sequence) is {kind}, not a list: give its "
                               "separator in the spec when each cell joins the events (separator = \"^\")")
        if categorical_key(pc.list_flatten(cols[name])[:0]).type != want:
            try:
                cols[name] = pc.cast(cols[name], pa.list_(want))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise AdapterError(f"{file}: column {name!r} (a sequence sharing the vocabulary of "
                                   f"{share!r}) holds values that are not {want}, as those of {share!r} "
                                   f"are: {e}") from None
    return pa.RecordBatch.from_pydict(cols)


@dataclass(frozen=True)
class RowPlace:
    """Where a chunk's rows are in their file, for a message that names a place the user can open: the
    line of a CSV, TSV or libsvm file, a Parquet file's row, a request's candidate.

    Why not the row number over all files (what the messages said before): with several files, or rows
    skipped as malformed, the user had to count to find it. A line is numbered as Arrow numbers it in its
    own conversion errors ("line 121" of :meth:`Source._conversion_error`): the header and every skipped
    row count, blank lines do not."""

    file: str | Path
    first: int = 0  # rows of the file before the chunk's first
    unit: str = "row"  # "line" | "row" | "candidate"
    header: int = 0  # lines: lines above the first data row
    bad: BadRows | None = None  # lines: the rows the reader skipped, read when a message is made

    def __call__(self, j: int) -> str:
        """``FILE: line L`` (or ``row K (from 0)``, ``candidate K``) of the chunk's row ``j``."""
        k = self.first + j
        if self.unit == "candidate":
            return f"{self.file}: candidate {k}"
        if self.unit != "line":
            return f"{self.file}: row {k} (from 0)"
        skipped = self.bad.skipped.get(str(self.file), []) if self.bad else []
        if self.bad and len(skipped) < self.bad.files.get(str(self.file), {}).get("rows", 0):
            return f"{self.file}: data row {k + 1} (from 1; not counting the rows skipped as malformed)"
        line = k + 1 + self.header
        for s in skipped:  # in order: each skipped line at or above it moves it one down
            if s > line:
                break
            line += 1
        return f"{self.file}: line {line}"


@dataclass
class Chunk:
    """One source batch with each row's number (over every file, from 0: example ids and splits are drawn
    from it), time, id and split (0 train, 1 valid, 2 test), and where its rows are for messages."""

    file: Path
    batch: pa.RecordBatch
    rows: np.ndarray
    ts: np.ndarray
    example_id: np.ndarray
    split: np.ndarray
    place: RowPlace


@dataclass
class Encoders:
    spec: ImportSpec
    vocabs: dict[str, CategoryVocab]
    dense: dict[str, DenseStats]
    surfaces: list[str]
    split_rows: list[int]
    surface_values: pa.Array = field(default_factory=lambda: pa.array([], pa.string()))

    def dense_summary(self) -> dict[str, Any]:
        return {k: {"mean": s.mean, "std": s.std, "train_missing": s.nulls} for k, s in self.dense.items()}

    def encode(self, chunk: Chunk, schema: FeatureSchema) -> pa.Table:
        b, n = chunk.batch, chunk.batch.num_rows
        cols: dict[str, Any] = {"example_id": chunk.example_id, "ts": chunk.ts}
        if self.spec.surface:
            col = pc.cast(b.column(self.spec.surface), pa.string())
            idx = pc.index_in(col, value_set=self.surface_values)
            if idx.null_count:  # rows the encoders were not fitted on (convert table --encoders)
                j = int(np.flatnonzero(idx.is_null().to_numpy(zero_copy_only=False))[0])
                value, known = col[j].as_py(), ", ".join(self.surfaces)
                raise AdapterError(f"{chunk.place(j)}, column {self.spec.surface!r} (surface): {value!r} is "
                                   f"not one of the surfaces the encoders know ({known})")
            cols["surface"] = idx.to_numpy(zero_copy_only=False).astype(np.int32)
        else:
            cols["surface"] = np.zeros(n, np.int32)
        for s in self.spec.sparse:
            cols[s.name] = _encoded(self.vocabs[s.name], b.column(s.name), chunk)
        for d in self.spec.dense:
            x = _floats(b.column(d.name))
            missing = ~np.isfinite(x)
            st = self.dense[d.name]
            if d.transform == "standardize":
                y = (x - st.mean) / st.std
            elif d.transform == "log1p":
                y = np.log1p(np.maximum(np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0), 0.0))
            else:
                y = x
            cols[d.name] = np.where(missing, 0.0, y).astype(np.float32)
            if d.missing_indicator:
                cols[f"{d.name}_missing"] = missing.astype(np.float32)
        heads = {q.name: q for q in self.spec.sequence if not q.group}
        lengths: dict[str, np.ndarray] = {}
        for q in sorted(self.spec.sequence, key=lambda q: bool(q.group)):  # each group's first field first
            ids = _encoded(self.vocabs[q.name], b.column(q.name), chunk)
            n_events = np.diff(ids.offsets.to_numpy())
            if q.group:
                _check_aligned(n_events, lengths[q.group], q, chunk)
            else:
                lengths[q.name] = n_events
            cols[q.output_column()] = tail_lists(ids, heads[q.group or q.name].max_len)
        for rule in self.spec.label_rules:
            y = rule.apply(_floats(b.column(rule.column))).astype(np.float32)
            cols[rule.name] = pa.array(y, mask=np.isnan(y))  # not observed: null, as the contract has it
        return pa.table({f.name: cols[f.name] for f in _arrow_fields(schema)})


def _encoded(vocab: CategoryVocab, col: pa.Array, chunk: Chunk) -> pa.Array:
    """``vocab.encode(col)``; a refused id is named by its row's place in the source."""
    try:
        return vocab.encode(col)
    except IdOutOfRange as e:
        raise AdapterError(f"{chunk.place(e.row)}, {e}") from None
    except AdapterError as e:
        raise AdapterError(f"{chunk.file}: {e}") from None


def _check_aligned(n_events: np.ndarray, n_group: np.ndarray, q: SequenceSpec, chunk: Chunk) -> None:
    """A grouped history holds one attribute of its group's events: as many in every row."""
    bad = np.flatnonzero(n_events != n_group)
    if len(bad):
        j = int(bad[0])
        raise AdapterError(f"{chunk.place(j)}, column {q.name!r} (sequence in the group {q.group!r}) holds "
                           f"{int(n_events[j])} events where {q.group!r} holds {int(n_group[j])}: a grouped "
                           "history gives one value per event of its group")


def _arrow_fields(schema: FeatureSchema) -> list[pa.Field]:
    return list(arrow_schema(schema))


def _check_labels(chunk: Chunk, rules: list[LabelRule]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each task's values (0/1, NaN = not observed) and observed mask; a plain label must be 0/1."""
    out = {}
    for rule in rules:
        x = _floats(chunk.batch.column(rule.column))
        seen = np.isfinite(x)
        bad = seen & (x != 0) & (x != 1)
        if not rule.derived and bad.any():
            j = int(np.flatnonzero(bad)[0])
            raise AdapterError(f"{chunk.place(j)}, column {rule.column!r} (label): value {x[j]:g} is not 0 "
                               "or 1 (empty = not observed; derive a label with --label NAME=COL OP NUMBER)")
        out[rule.name] = (rule.apply(x), seen)
    return out


def fit_encoders(
    spec: ImportSpec, chunks: Iterable[Chunk], fit: bool = True
) -> tuple[Encoders, dict[str, Any]]:
    """Pass 1 over ``chunks``: vocabularies and statistics from train rows, counts from all rows.

    ``fit=False`` only counts (rows, labels, times, surfaces): ``convert table --encoders`` keeps another
    dataset's encoders, so counting the values of its training rows would be work thrown away."""
    fixed = {s.name: CategoryVocab(s.name, None, s.vocab, fixed=True) for s in spec.sparse if s.vocab}
    counters = {s.name: CategoryCounter(s.name, spec.hash_buckets) for s in [*spec.sparse, *spec.sequence]
                if fit and s.name not in fixed and not getattr(s, "share", "")}
    shared = {q.name: q.share for q in spec.sequence if q.share}  # events count into the item's vocabulary
    dense = {d.name: DenseStats() for d in spec.dense} if fit else {}
    surfaces: set[str] = set()
    split_rows = [0] * N_SPLITS
    rules = spec.label_rules
    label_sum = {r.name: [0.0] * N_SPLITS for r in rules}
    label_n = {r.name: [0] * N_SPLITS for r in rules}
    ts_min: list[int | None] = [None] * N_SPLITS
    ts_max: list[int | None] = [None] * N_SPLITS
    for chunk in chunks:
        labels = _check_labels(chunk, rules)
        for code in range(N_SPLITS):
            m = chunk.split == code
            k = int(m.sum())
            if not k:
                continue
            split_rows[code] += k
            lo, hi = int(chunk.ts[m].min()), int(chunk.ts[m].max())
            ts_min[code] = lo if ts_min[code] is None else min(ts_min[code], lo)
            ts_max[code] = hi if ts_max[code] is None else max(ts_max[code], hi)
            for c, (y, seen) in labels.items():
                label_sum[c][code] += float(y[m & seen].sum())
                label_n[c][code] += int((m & seen).sum())
        if spec.surface:
            col = chunk.batch.column(spec.surface)
            if col.null_count:
                j = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
                raise AdapterError(f"{chunk.place(j)}, column {spec.surface!r} (surface): empty value")
            surfaces.update(pc.unique(pc.cast(col, pa.string())).to_pylist())
            if len(surfaces) > MAX_SURFACES:
                raise AdapterError(f"{chunk.file}: column {spec.surface!r} (surface) has more than "
                                   f"{MAX_SURFACES} distinct values: a surface is a placement, not an id")
        train = chunk.split == 0
        for d in spec.dense:  # each column converted once: the range check, then the train rows' statistics
            x = _floats(chunk.batch.column(d.name))
            _check_float32_range(chunk, d.name, x)
            if d.name in dense and train.any():
                dense[d.name].update(x[train])
        if not train.any():
            continue
        tb = chunk.batch.filter(pa.array(train))
        for name, counter in counters.items():
            counter.update(tb.column(name))
        for name, share in shared.items():
            if share in counters:
                counters[share].update(tb.column(name))
    force = {s.name for s in spec.sparse if s.hash}
    vocabs = {name: c.finish(spec.min_count, name in force) for name, c in counters.items()} | fixed
    vocabs |= {name: vocabs[share] for name, share in shared.items() if share in vocabs}
    names = sorted(surfaces) if spec.surface else ["all"]
    enc = Encoders(spec, vocabs, dense, names, split_rows, pa.array(names, pa.string()))
    return enc, {"label_sum": label_sum, "label_n": label_n, "ts_min": ts_min, "ts_max": ts_max}
