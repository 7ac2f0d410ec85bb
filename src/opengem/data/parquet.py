"""Canonical Parquet: writing it, checking it against a FeatureSchema, and turning row groups into Batches.

Three jobs that share one in-memory form, :class:`Columns` (numpy arrays per column; list columns as
lengths + flat values), because the checks, the repairs and the batching all want flat numpy, and doing
them on flat arrays keeps a million-row row group a handful of vectorised passes instead of Python loops.

Bad input policy (DESIGN §4). Every problem is found per (file, column, problem) and either raises a
:class:`DataError` naming file, column and row (row = index within the file), or, where the schema or the
caller says so, is repaired or dropped and counted in a :class:`ProblemLog`:

- sparse / sequence id below 0 or >= vocab: ``on_oov`` error | hash (``id mod vocab``, numpy's ``mod``,
  so -1 becomes vocab-1) | clamp (into [0, vocab-1]) | skip (drop the row);
- dense NaN/Inf/null (also inside sequence dense fields): ``on_nan`` error | zero | skip;
- sequence longer than ``max_len``: ``on_overflow`` error | truncate (keep the most recent ``max_len``
  events: lists are oldest first) | skip;
- null example_id/ts, surface outside [0, n_surfaces), label not in {0, 1, null}, fields of one sequence
  group with different lengths in a row: the schema-wide ``on_error`` (error | skip);
- missing column, wrong column type, empty (0-byte or 0-row) or corrupt file: error, or under
  ``on_error=skip`` the whole file (or corrupt row group) is skipped and counted.

A caller's ``on_error="skip"`` turns every ``error`` policy into ``skip`` and leaves declared repairs alone.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from opengem.data.batch import Batch, SequenceBatch
from opengem.data.commit import fsync_file
from opengem.data.dataset import arrow_schema
from opengem.data.match_features import first_values, match_feature_values
from opengem.data.schema import FeatureSchema
from opengem.data.time_features import time_feature_values
from opengem.errors import OpengemError

if TYPE_CHECKING:  # torch/torchrec are imported only when Batches are built: `opengem validate` skips them
    import torch

    from opengem.data.batch import Batch

ON_ERROR = ("error", "skip")
Jagged = tuple[np.ndarray, np.ndarray]  # (lengths [n], flat values)
REPAIRS = ("hash", "clamp", "zero", "truncate")


class DataError(OpengemError, ValueError):
    """Bad input data; the message names the file, column and row so the fix starts at the right place."""

    def __init__(self, file: str | Path, what: str, column: str | None = None, row: int | None = None):
        self.file, self.column, self.row, self.what = str(file), column, row, what
        loc = str(file)
        if column is not None:
            loc += f": column {column!r}"
        if row is not None:
            loc += f", row {row}" if column is not None else f": row {row}"
        super().__init__(f"{loc}: {what}")
        self.also: list[DataError] = []  # further problems of the same file found in the same check

    def __reduce__(self) -> tuple:  # picklable across worker processes with its fields
        return (DataError, (self.file, self.what, self.column, self.row))


# =========================================================================== problem accounting
@dataclass(frozen=True)
class Problem:
    file: str
    column: str | None
    row: int | None
    what: str
    action: str

    def __str__(self) -> str:
        where = " ".join(part for part in (f"column {self.column!r}" if self.column is not None else "",
                                            f"row {self.row}" if self.row is not None else "") if part)
        return f"{self.file}{': ' + where if where else ''}: {self.what} [{self.action}]"


class ProblemLog:
    """Counts per (file, column, problem) plus the first ``keep`` individual problems with their rows.

    ``raise_errors``: a problem whose action is ``error`` raises (the loader); when False it is only
    recorded and the row dropped (``opengem validate``, which must list everything).
    """

    def __init__(self, raise_errors: bool = True, keep: int = 100) -> None:
        self.raise_errors = raise_errors
        self.keep = keep
        self.counts: Counter[tuple[str, str, str]] = Counter()
        self.samples: list[Problem] = []

    def add(self, file: str | Path, column: str | None, what: str, action: str,
            rows: np.ndarray | None = None, detail: np.ndarray | None = None,
            count: int | None = None) -> None:
        """Record a problem at ``rows`` (values ``detail``). ``count``, when given, is how many there are
        in all, of which ``rows`` may hold only the first few (a repair need not find every row)."""
        file = str(file)
        if action == "error" and self.raise_errors:
            row = None if rows is None or not len(rows) else int(rows[0])
            extra = "" if detail is None or not len(detail) else f" (value {detail[0]})"
            raise DataError(file, what + extra, column, row)
        n = count if count is not None else 1 if rows is None else len(rows)
        self.counts[(file, column or "", what)] += n
        room = self.keep - len(self.samples)
        if room > 0:
            if rows is None:
                self.samples.append(Problem(file, column, None, what, action))
            else:
                for i, r in enumerate(rows[:room]):
                    d = "" if detail is None else f" (value {detail[i]})"
                    self.samples.append(Problem(file, column, int(r), what + d, action))

    def merge(self, counts: dict[tuple[str, str, str], int], samples: list[Problem] = ()) -> None:
        self.counts.update(counts)
        self.samples += list(samples)[: max(0, self.keep - len(self.samples))]

    @property
    def room(self) -> int:
        """How many more individual problems this log keeps."""
        return max(0, self.keep - len(self.samples))

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def report(self) -> str:
        if not self.counts:
            return "no problems"
        lines = [f"{self.total} problem(s):"]
        for (file, col, what), n in sorted(self.counts.items()):
            lines.append(f"  {file}: {f'column {col}: ' if col else ''}{what}: {n}")
        return "\n".join(lines)


def effective_on_error(schema: FeatureSchema, on_error: str | None) -> str:
    value = on_error or schema.on_error
    if value not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {value!r}")
    return value


def _policy(declared: str, on_error: str) -> str:
    return "skip" if declared == "error" and on_error == "skip" else declared


# =========================================================================== writing
def _compatible(actual: pa.DataType, expected: pa.DataType) -> bool:
    if pa.types.is_null(actual):
        return True
    if pa.types.is_list(expected):
        if not (pa.types.is_list(actual) or pa.types.is_large_list(actual)):
            return False
        return _compatible(actual.value_type, expected.value_type)
    if pa.types.is_integer(expected):
        return pa.types.is_integer(actual)
    if pa.types.is_floating(expected):
        return pa.types.is_floating(actual) or pa.types.is_integer(actual)
    return actual == expected


def conform_table(table: pa.Table, schema: FeatureSchema, file: str | Path,
                  target: pa.Schema | None = None, check_nulls: bool = True) -> pa.Table:
    """Cast a table to canonical types, or raise naming the column that cannot be cast.

    ``check_nulls=False`` leaves nulls in non-nullable columns to :func:`check_columns`, which can skip
    the row instead of the whole file.
    """
    target = target or arrow_schema(schema)
    plan = _conform_plan(table.schema, target, file)
    if plan is None:  # already canonical: only the null check
        if check_nulls:
            for f, col in zip(target, table.columns, strict=True):
                _check_not_null(f, col, file)
        return table
    columns = table.columns
    cols = []
    for f, (i, cast, compatible) in zip(target, plan, strict=True):
        col = columns[i]
        if not compatible:
            raise DataError(file, f"wrong type {col.type}, expected {f.type}", f.name)
        if cast:
            try:
                col = col.cast(f.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise DataError(file, f"cannot cast {col.type} to {f.type}: {e}", f.name) from None
        if check_nulls:
            _check_not_null(f, col, file)
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=target)


def _check_not_null(f: pa.Field, col: pa.ChunkedArray, file: str | Path) -> None:
    if not f.nullable and col.null_count:
        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(file, "null value in a non-nullable column", f.name, row)


_Plan = list[tuple[int, bool, bool]]
_last_plan: tuple[pa.Schema, pa.Schema, _Plan | None] | None = None


def _conform_plan(actual: pa.Schema, target: pa.Schema, file: str | Path) -> _Plan | None:
    """Per target field: the index of its column in ``actual``, whether it needs a cast and whether it can
    have one (the caller raises for the first that cannot, in column order as before); None when
    ``actual`` is ``target`` already. A missing, extra or repeated column raises.

    Why a cache of the last schema: a server conforms every request, and every request of a client has
    the same schema; the name lookups and type decisions (13 columns on a VM) were most of the cost of
    ``conform_table`` on 512 rows, and comparing two schemas is one C call. The file's rows all share
    its schema too."""
    global _last_plan
    last = _last_plan
    if last is not None and last[1] is target and last[0].equals(actual):
        return last[2]
    names = actual.names
    missing = [f.name for f in target if f.name not in names]
    if missing:
        raise DataError(file, "missing column (required by schema)", missing[0])
    extra = sorted(set(names) - set(target.names))
    if extra:
        raise DataError(file, "column not in schema", extra[0])
    plan: _Plan | None = []
    for f in target:
        i = actual.get_field_index(f.name)
        if i < 0:  # (present, as checked above: so more than once)
            raise DataError(file, "column given more than once", f.name)
        t = actual.field(i).type
        # (a column of the canonical type is compatible: no check, no cast)
        plan.append((i, t != f.type, t == f.type or _compatible(t, f.type)))
    if actual.equals(target, check_metadata=False):
        plan = None
    _last_plan = (actual, target, plan)
    return plan


def _to_arrow(value: Any, target: pa.Field) -> pa.Array:
    if isinstance(value, (pa.Array, pa.ChunkedArray)):
        return value
    if isinstance(value, tuple) and len(value) == 2 and pa.types.is_list(target.type):
        lengths, values = (np.asarray(v) for v in value)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    if isinstance(value, np.ndarray) and value.ndim == 1:
        return pa.array(value)
    try:
        return pa.array(value, type=target.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
        return pa.array(value)  # let conform_table name the wrong type


class CanonicalWriter:
    """Writes canonical Parquet in fixed-size row groups; the file appears only when complete.

    Row groups are the loader's unit of work (sharding and resume), so they are cut to exactly
    ``row_group_size`` rows whatever the sizes of the pieces written. Data goes to a hidden temporary
    name, fsynced and renamed over ``path`` on a clean close: an exception inside the ``with`` block
    leaves any earlier file at ``path`` untouched. Page checksums are written so that corruption is
    detected on read instead of decoded as garbage. (A whole dataset is committed with its markers by
    :mod:`opengem.data.commit`: write its files into a ``staged_dir``, or ``mark_complete`` it.)

    ``write`` takes a pyarrow Table or RecordBatch, or a dict column -> values where values are a
    pyarrow array, a 1-D numpy array, a Python list, or for list columns a ``(lengths, flat_values)`` pair.
    """

    def __init__(self, schema: FeatureSchema, path: str | Path, row_group_size: int = 65536,
                 compression: str = "snappy") -> None:
        if row_group_size <= 0:
            raise ValueError(f"row_group_size must be > 0, got {row_group_size}")
        self.schema = schema
        self.arrow = arrow_schema(schema)
        self.path = Path(path)
        self.tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}-{id(self)}")
        self.row_group_size = row_group_size
        self.compression = compression
        self.rows_written = 0
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._writer: pq.ParquetWriter | None = None
        self._done = False

    def __enter__(self) -> CanonicalWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def write(self, data: pa.Table | pa.RecordBatch | dict[str, Any]) -> None:
        if self._done:
            raise RuntimeError(f"{self.path}: writer already closed")
        if isinstance(data, dict):
            missing = [f.name for f in self.arrow if f.name not in data]
            if missing:
                raise DataError(self.path, "missing column (required by schema)", missing[0])
            extra = sorted(set(data) - set(self.arrow.names))
            if extra:
                raise DataError(self.path, "column not in schema", extra[0])
            arrays = {}
            for f in self.arrow:
                try:
                    arrays[f.name] = _to_arrow(data[f.name], f)
                except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
                    raise DataError(self.path, f"cannot convert to {f.type}: {e}", f.name) from None
            data = pa.table(arrays)
        elif isinstance(data, pa.RecordBatch):
            data = pa.Table.from_batches([data])
        table = conform_table(data, self.schema, self.path, self.arrow)
        if table.num_rows == 0:
            return
        self._pending.append(table)
        self._pending_rows += table.num_rows
        while self._pending_rows >= self.row_group_size:
            self._flush(self.row_group_size)

    def _open(self) -> pq.ParquetWriter:
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(self.tmp, self.arrow, compression=self.compression,
                                            write_page_checksum=True)
        return self._writer

    def _flush(self, n: int) -> None:
        table = pa.concat_tables(self._pending)
        head, rest = table.slice(0, n), table.slice(n)
        self._open().write_table(head, row_group_size=n)
        self.rows_written += head.num_rows
        self._pending = [rest] if rest.num_rows else []
        self._pending_rows = rest.num_rows

    def close(self) -> None:
        if self._done:
            return
        try:
            if self._pending_rows:
                self._flush(self._pending_rows)
            self._open().close()
            fsync_file(self.tmp)  # the data is on disk before the name says the file is complete
            os.replace(self.tmp, self.path)
        except BaseException:
            self.abort()
            raise
        self._done = True

    def abort(self) -> None:
        self._done = True
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:
                pass
        self.tmp.unlink(missing_ok=True)


def write_parquet(schema: FeatureSchema, path: str | Path, data: pa.Table | dict[str, Any],
                  row_group_size: int = 65536) -> None:
    with CanonicalWriter(schema, path, row_group_size) as w:
        w.write(data)


# =========================================================================== reading a file
@dataclass
class FileInfo:
    path: str
    row_groups: list[int]  # rows per row group
    # The footer as inspected, and the file's (size, mtime_ns) then: a row group's read reopens the file
    # without parsing the footer again while both are unchanged (the study's 196-row-group day files: 4 ms a
    # parse, 0.1 ms an open that reuses it; the loader opens the file once per row group it reads).
    footer: pq.FileMetaData | None = field(default=None, compare=False, repr=False)
    stamp: tuple[int, int] | None = field(default=None, compare=False, repr=False)

    @property
    def num_rows(self) -> int:
        return sum(self.row_groups)

    def row_start(self, rg: int) -> int:
        return sum(self.row_groups[:rg])


def open_parquet(path: str | Path, footer: pq.FileMetaData | None = None,
                 stamp: tuple[int, int] | None = None) -> pq.ParquetFile:
    """The file opened for reading; ``footer``, read earlier when the file's (size, mtime_ns) was ``stamp``,
    is reused while the file still has that stamp, else the footer is read again."""
    return _open_stamped(path, footer, stamp)[0]


def _open_stamped(path: str | Path, footer: pq.FileMetaData | None = None,
                  stamp: tuple[int, int] | None = None) -> tuple[pq.ParquetFile, tuple[int, int]]:
    """:func:`open_parquet`, and the file's (size, mtime_ns) as stated before its footer was read: a file
    rewritten after that has another stamp, so a footer kept with this stamp is never reused for it."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError as e:
        raise DataError(path, f"cannot open: {e.strerror or e}") from None
    if st.st_size == 0:
        raise DataError(path, "empty file (0 bytes)")
    now = (st.st_size, st.st_mtime_ns)
    try:
        pf = pq.ParquetFile(path, page_checksum_verification=True,
                            metadata=footer if footer is not None and stamp == now else None)
    except Exception as e:  # pyarrow raises ArrowInvalid, OSError ... for a bad footer
        raise DataError(path, f"corrupt or truncated Parquet file ({type(e).__name__}: {e})") from None
    return pf, now


def inspect_file(path: str | Path, schema: FeatureSchema) -> FileInfo:
    """File-level checks (readable footer, columns, types, rows) from the footer alone."""
    pf, stamp = _open_stamped(path)
    actual = pf.schema_arrow
    problems = []
    for f in arrow_schema(schema):
        idx = actual.get_field_index(f.name)
        if idx < 0:
            problems.append(DataError(path, "missing column (required by schema)", f.name))
        elif not _compatible(actual.field(idx).type, f.type):
            what = f"wrong type {actual.field(idx).type}, expected {f.type}"
            problems.append(DataError(path, what, f.name))
    if problems:  # the first is raised; validate reports every one (``also``)
        problems[0].also = problems[1:]
        raise problems[0]
    md = pf.metadata
    rgs = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
    if sum(rgs) == 0:
        raise DataError(path, "empty file (0 rows)")
    return FileInfo(str(path), rgs, md, stamp)


def read_row_group(info: FileInfo, rg: int, schema: FeatureSchema) -> pa.Table:
    pf = open_parquet(info.path, info.footer, info.stamp)
    try:
        table = pf.read_row_group(rg, columns=schema.required_columns())
    except Exception as e:
        raise DataError(info.path, f"corrupt row group {rg} ({type(e).__name__}: {e})",
                        row=info.row_start(rg)) from None
    return conform_table(table, schema, info.path, check_nulls=False)


def iter_row_group(info: FileInfo, rg: int, schema: FeatureSchema, start: int = 0,
                   chunk_rows: int = 8192) -> Iterator[tuple[pa.Table, int]]:
    """(table, first row within the row group) pieces of one row group from row ``start`` on.

    Pieces of ``chunk_rows`` keep memory bounded by the piece, not by the row group the writer chose.
    """
    pf = open_parquet(info.path, info.footer, info.stamp)
    pos = 0
    try:
        for rb in pf.iter_batches(batch_size=chunk_rows, row_groups=[rg], columns=schema.required_columns(),
                                  use_threads=False):
            n = rb.num_rows
            if pos + n > start:
                t = pa.Table.from_batches([rb]).slice(max(0, start - pos))
                yield conform_table(t, schema, info.path, check_nulls=False), max(start, pos)
            pos += n
    except DataError:
        raise
    except Exception as e:
        raise DataError(info.path, f"corrupt row group {rg} ({type(e).__name__}: {e})",
                        row=info.row_start(rg) + pos) from None


# =========================================================================== numpy columns
def _writable(a: np.ndarray) -> np.ndarray:
    return a if a.flags.writeable else a.copy()


@dataclass
class Columns:
    """Numpy form of some rows of one file (or of several, once concatenated for a batch).

    ``lists`` hold list columns and single-valued sparse ids alike as (lengths [n], flat values): a null
    single-valued id is a row of length 0. ``rows`` is each row's index within its file: error messages
    need it, and the loader's resume offsets are computed from it.
    """

    n: int
    scalars: dict[str, np.ndarray]
    masks: dict[str, np.ndarray]  # label and bookkeeping columns -> not null
    lists: dict[str, tuple[np.ndarray, np.ndarray]]
    rows: np.ndarray
    _offsets: dict[str, np.ndarray] = field(default_factory=dict, repr=False)  # cache for slice()

    def offsets(self, name: str) -> np.ndarray:
        """[n+1] start of each row's values; cached because a row group is sliced into many batches."""
        if name not in self._offsets:
            ln = self.lists[name][0]
            off = np.zeros(len(ln) + 1, dtype=np.int64)
            np.cumsum(ln, out=off[1:])
            self._offsets[name] = off
        return self._offsets[name]

    @staticmethod
    def from_arrow(table: pa.Table, schema: FeatureSchema, first_row: int = 0) -> Columns:
        table = table.combine_chunks()
        n = table.num_rows
        scalars: dict[str, np.ndarray] = {}
        masks: dict[str, np.ndarray] = {}
        lists: dict[str, tuple[np.ndarray, np.ndarray]] = {}

        def col(name: str) -> pa.Array:
            c = table.column(name)
            return c.chunk(0) if c.num_chunks == 1 else pa.concat_arrays(c.chunks) if c.num_chunks \
                else pa.array([], type=c.type)

        for name in (schema.example_id_column, schema.time_column, schema.surface_column):
            a = col(name)
            masks[name] = _not_null(a)
            scalars[name] = _filled_np(a, 0, np.int64)
        for f in schema.dense:
            scalars[f.name] = _filled_np(col(f.name), np.nan, np.float32)
        for t in schema.tasks:
            a = col(t.label_column)
            masks[t.label_column] = _not_null(a)
            scalars[t.label_column] = _filled_np(a, 0, np.float32)
        for f in schema.sparse:
            a = col(f.name)
            if f.multi_valued:
                lists[f.name] = _list_np(a, -1, np.int64)
            elif a.null_count:
                valid = _not_null(a)
                lists[f.name] = (valid.astype(np.int64), _filled_np(a, 0, np.int64)[valid])
            else:  # no nulls (the common case): every row has one id, and no mask to apply
                lists[f.name] = (np.ones(n, dtype=np.int64), _filled_np(a, 0, np.int64))
        for g in schema.sequences:
            for f in g.fields:
                if f.kind == "id":
                    lists[g.column(f.name)] = _list_np(col(g.column(f.name)), -1, np.int64)
                else:
                    lists[g.column(f.name)] = _list_np(col(g.column(f.name)), np.nan, np.float32)
        return Columns(n, scalars, masks, lists, np.arange(first_row, first_row + n, dtype=np.int64))

    def take(self, keep: np.ndarray) -> Columns:
        """Rows where the bool mask ``keep`` is True."""
        if keep.all():
            return self
        lists = {k: (ln[keep], v[np.repeat(keep, ln)]) for k, (ln, v) in self.lists.items()}
        return Columns(int(keep.sum()), {k: v[keep] for k, v in self.scalars.items()},
                       {k: v[keep] for k, v in self.masks.items()}, lists, self.rows[keep])

    def gather(self, idx: np.ndarray) -> Columns:
        """Rows ``idx`` (integer indices, any order; the loader's row mixing reorders with it)."""
        lists = {}
        for k, (ln, v) in self.lists.items():
            starts = self.offsets(k)[:-1][idx]
            lengths = ln[idx]
            first = np.zeros(len(idx), dtype=np.int64)
            np.cumsum(lengths[:-1], out=first[1:])
            lists[k] = (lengths, v[np.repeat(starts - first, lengths) + np.arange(int(lengths.sum()))])
        return Columns(len(idx), {k: v[idx] for k, v in self.scalars.items()},
                       {k: v[idx] for k, v in self.masks.items()}, lists, self.rows[idx])

    def slice(self, start: int, stop: int) -> Columns:
        stop = min(stop, self.n)
        if start == 0 and stop == self.n:
            return self
        lists = {}
        for k, (ln, v) in self.lists.items():
            off = self.offsets(k)
            lists[k] = (ln[start:stop], v[off[start]:off[stop]])
        return Columns(stop - start, {k: v[start:stop] for k, v in self.scalars.items()},
                       {k: v[start:stop] for k, v in self.masks.items()}, lists, self.rows[start:stop])

    @staticmethod
    def concat(parts: list[Columns]) -> Columns:
        if len(parts) == 1:
            return parts[0]
        p0 = parts[0]
        return Columns(
            sum(p.n for p in parts),
            {k: np.concatenate([p.scalars[k] for p in parts]) for k in p0.scalars},
            {k: np.concatenate([p.masks[k] for p in parts]) for k in p0.masks},
            {k: (np.concatenate([p.lists[k][0] for p in parts]),
                 np.concatenate([p.lists[k][1] for p in parts])) for k in p0.lists},
            np.concatenate([p.rows for p in parts]),
        )


def _not_null(a: pa.Array) -> np.ndarray:
    """[n] bool, True where ``a`` has a value. Without nulls (the usual case) no Arrow kernel runs: a
    kernel call has a fixed cost of tens of microseconds, which a 512-row request pays per column."""
    if not a.null_count:
        return np.ones(len(a), dtype=bool)
    if a.null_count == len(a):  # (labels at serving time: never observed)
        return np.zeros(len(a), dtype=bool)
    return ~a.is_null().to_numpy(zero_copy_only=False)


def _filled_np(a: pa.Array, fill: float, dtype: type) -> np.ndarray:
    """``a`` as numpy ``dtype`` with nulls replaced by ``fill``; ``fill_null`` runs only when there are
    nulls (same values either way: filling nothing is the identity)."""
    if a.null_count == len(a) and len(a):
        return np.full(len(a), fill, dtype=dtype)
    if a.null_count:
        a = a.fill_null(fill)
    return a.to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def _list_np(a: pa.Array, fill: float, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, flat values) of a list array; null lists are empty, null elements become ``fill``.

    Without null lists (the usual case) the lengths are a difference of the offsets and the values a
    zero-copy slice of the child array: the same arrays as ``list_value_length`` and ``flatten``, whose
    kernel calls cost ~3x as much on a 512-row request (three list columns on a VM's schema)."""
    if a.null_count:
        lengths = _filled_np(pc.list_value_length(a), 0, np.int64)
        return lengths, _filled_np(a.flatten(), fill, dtype)
    off = a.offsets.to_numpy()
    values = a.values
    if len(off) and (off[0] or off[-1] != len(values)):  # a slice of a bigger array: its own values
        values = values.slice(int(off[0]), int(off[-1] - off[0]))
    return (off[1:] - off[:-1]).astype(np.int64), _filled_np(values, fill, dtype)


# =========================================================================== checking and repairing
def check_columns(cols: Columns, schema: FeatureSchema, file: str | Path, log: ProblemLog,
                  on_error: str | None = None) -> Columns:
    """Find every problem in ``cols``; raise, repair or drop per policy; return the rows that survive."""
    on_error = effective_on_error(schema, on_error)
    n = cols.n
    drop = np.zeros(n, dtype=bool)
    if n == 0:
        return cols

    def row_problem(column: str, what: str, bad: np.ndarray, action: str, detail: np.ndarray | None = None):
        idx = np.flatnonzero(bad)
        log.add(file, column, what, action, cols.rows[idx], None if detail is None else detail[idx])
        drop[idx] = True  # only reached for skip (or validate's record-only error)

    # bookkeeping columns and surface
    # (each check first asks the cheapest question that proves the column clean: ``all`` of a mask, a
    # min/max, no value at all; the masks of bad rows are built only when there are some)
    for name in (schema.example_id_column, schema.time_column, schema.surface_column):
        if not cols.masks[name].all():
            row_problem(name, "null value", ~cols.masks[name], on_error)
    surf = cols.scalars[schema.surface_column]
    if surf.min() < 0 or surf.max() >= len(schema.surfaces):
        bad = cols.masks[schema.surface_column] & ((surf < 0) | (surf >= len(schema.surfaces)))
        if bad.any():
            row_problem(schema.surface_column, f"surface out of range [0, {len(schema.surfaces)})", bad,
                        on_error, surf)
    # labels
    for t in schema.tasks:
        c = t.label_column
        v, m = cols.scalars[c], cols.masks[c]
        if not m.any():  # no label at all (serving: never observed)
            continue
        bad = m & (v != 0) & (v != 1)
        if bad.any():
            row_problem(c, "label not in {0, 1, null}", bad, on_error, v)
    # dense
    dense_repairs: dict[str, np.ndarray] = {}
    for f in schema.dense:
        v = cols.scalars[f.name]
        bad = ~np.isfinite(v)
        if bad.any():
            pol = _policy(f.on_nan, on_error)
            if pol == "zero":
                log.add(file, f.name, "NaN/Inf/null dense value", pol, cols.rows[bad], v[bad])
                v = v.copy()
                v[bad] = 0.0
                dense_repairs[f.name] = v
            else:
                row_problem(f.name, "NaN/Inf/null dense value", bad, pol, v)
    # sparse ids
    list_repairs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for f in schema.sparse:
        ln, v = cols.lists[f.name]
        nv = _check_ids(f.name, ln, v, f.vocab, _policy(f.on_oov, on_error), cols, file, log, drop)
        if nv is not v:
            list_repairs[f.name] = (ln, nv)
    # sequences
    for g in schema.sequences:
        names = [g.column(f.name) for f in g.fields]
        ln0 = cols.lists[names[0]][0]
        for name in names[1:]:
            bad = cols.lists[name][0] != ln0
            if bad.any():
                row_problem(name, f"length differs from {names[0]!r} in the same sequence group", bad,
                            on_error, cols.lists[name][0])
        over = ln0 > g.max_len
        group = {name: cols.lists[name] for name in names}
        if over.any():
            pol = _policy(g.on_overflow, on_error)
            if pol == "truncate":
                log.add(file, names[0], f"sequence longer than max_len {g.max_len}", pol,
                        cols.rows[over], ln0[over])
                group = _truncate(group, g.max_len)
            else:
                row_problem(names[0], f"sequence longer than max_len {g.max_len}", over, pol, ln0)
        for f in g.fields:
            name = g.column(f.name)
            ln, v = group[name]
            if f.kind == "id":
                nv = _check_ids(name, ln, v, f.vocab, _policy(f.on_oov, on_error), cols, file, log, drop)
            else:
                nv = _check_seq_dense(name, ln, v, _policy(f.on_nan, on_error), cols, file, log, drop)
            if nv is not v or group[name] is not cols.lists[name]:
                list_repairs[name] = (ln, nv)
    if dense_repairs or list_repairs:
        cols = Columns(cols.n, {**cols.scalars, **dense_repairs}, cols.masks, {**cols.lists, **list_repairs},
                       cols.rows)
    return cols.take(~drop) if drop.any() else cols


def _element_rows(ln: np.ndarray, bad: np.ndarray) -> np.ndarray:
    """Row index (within cols) of each bad flat element (``bad``: a mask, or the flat indices)."""
    index = np.flatnonzero(bad) if bad.dtype == bool else bad
    return np.searchsorted(np.cumsum(ln), index, side="right")


def _check_ids(name: str, ln: np.ndarray, v: np.ndarray, vocab: int, pol: str, cols: Columns,
               file: str | Path, log: ProblemLog, drop: np.ndarray) -> np.ndarray:
    if not len(v):
        return v
    # two reductions and no mask in the common in-range case; the masks only when some id is out of range
    # (a served request pays this per id column: 7 of them on a VM's schema)
    lo, hi = v.min(), v.max()
    if lo >= 0 and hi < vocab:
        return v
    neg = v < 0 if lo < 0 else None
    big = v >= vocab if hi >= vocab else None
    for bad, what in ((neg, "negative id (or null element)"), (big, f"id beyond vocabulary {vocab}")):
        if bad is None:
            continue
        if pol == "skip" or pol == "error":
            r = _element_rows(ln, bad)
            log.add(file, name, what, pol, cols.rows[r], v[bad])
            drop[r] = True
        else:  # a repair drops nothing: find the rows of only the ids the log keeps (a VM schema hashes
            # most ids of a request past its cap, and finding every row cost more than the rest)
            room = log.room  # (a server's log keeps no samples: then no search for them either)
            first = np.flatnonzero(bad)[:room] if room else np.zeros(0, dtype=np.int64)
            r = _element_rows(ln, first) if room else first
            log.add(file, name, what, pol, cols.rows[r], v[first], count=int(np.count_nonzero(bad)))
    if pol == "hash":
        return np.mod(v, vocab)
    if pol == "clamp":
        return np.clip(v, 0, vocab - 1)
    return v


def _check_seq_dense(name: str, ln: np.ndarray, v: np.ndarray, pol: str, cols: Columns,
                     file: str | Path, log: ProblemLog, drop: np.ndarray) -> np.ndarray:
    bad = ~np.isfinite(v)
    if not bad.any():
        return v
    r = _element_rows(ln, bad)
    log.add(file, name, "NaN/Inf/null dense value", pol, cols.rows[r], v[bad])
    if pol == "zero":
        v = v.copy()
        v[bad] = 0.0
    else:
        drop[r] = True
    return v


def _truncate(group: dict[str, Jagged], max_len: int) -> dict[str, Jagged]:
    """Keep the last ``max_len`` events of each row (lists are oldest first, so the most recent).

    The fields of a group share their lengths (unless a row's differ, which the caller has flagged), so
    the mask of kept events is built once per distinct lengths, not per field: building it (a repeat over
    every event) was half of the loader's row checks on a served batch of 8192 rows."""
    out = {}
    masks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (lengths, kept lengths, keep mask)
    for name, (ln, v) in group.items():
        mask = next((m for m in masks if m[0] is ln or np.array_equal(m[0], ln)), None)
        if mask is None:
            new_ln = np.minimum(ln, max_len)
            new_end = np.cumsum(new_ln)
            # the flat index of each kept event: its index among the kept ones plus how many events of
            # its row and the rows before were cut (end - new_end); O(rows + kept events), ~30% less than
            # the [rows, max_len] grid it replaces on a served request, and no mask over every event
            kept = int(new_end[-1]) if len(new_end) else 0
            keep = np.arange(kept) + np.repeat(np.cumsum(ln) - new_end, new_ln)
            mask = (ln, new_ln, keep)
            masks.append(mask)
        out[name] = (mask[1], v[mask[2]])
    return out


# =========================================================================== to a Batch
def _t(a: np.ndarray) -> torch.Tensor:
    import torch

    return torch.from_numpy(_writable(np.ascontiguousarray(a)))


def to_batch(cols: Columns, schema: FeatureSchema) -> Batch:
    """A Batch over the arrays of ``cols`` (no copy where numpy already holds the right dtype)."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    B = cols.n
    if schema.dense:
        dense = np.stack([cols.scalars[f.name] for f in schema.dense], axis=1).astype(np.float32, copy=False)
    else:
        dense = np.zeros((B, 0), dtype=np.float32)
    if schema.time_features:  # derived here, the loader's and the Predictor's one path: no train/serve skew
        clock = time_feature_values(cols.scalars[schema.time_column], schema.time_features, schema.time_unit)
        dense = np.concatenate([dense, clock], axis=1)
    if schema.match_features:  # likewise: history-vs-item counts (opengem.data.match_features)
        parts = []
        for m in schema.match_features:
            ln, vals = cols.lists[schema.sequence(m.sequence).column(m.field)]
            parts.append(match_feature_values(ln, vals, first_values(*cols.lists[m.feature]), m.recent))
        dense = np.concatenate([dense, *parts], axis=1)
    if schema.sparse:
        keys = schema.sparse_names
        lengths = np.concatenate([cols.lists[k][0] for k in keys])
        values = np.concatenate([cols.lists[k][1] for k in keys])
        sparse = KeyedJaggedTensor(keys=keys, values=_t(values.astype(np.int64, copy=False)),
                                   lengths=_t(lengths.astype(np.int64, copy=False)))
    else:
        sparse = KeyedJaggedTensor.empty()
    seqs = {}
    for g in schema.sequences:
        ln = cols.lists[g.column(g.fields[0].name)][0]
        seqs[g.name] = SequenceBatch(
            lengths=_t(ln.astype(np.int64, copy=False)),
            ids={f.name: _t(cols.lists[g.column(f.name)][1]) for f in g.id_fields},
            dense={f.name: _t(cols.lists[g.column(f.name)][1]) for f in g.dense_fields},
        )
    if schema.tasks:
        labels = np.stack([cols.scalars[t.label_column] for t in schema.tasks], axis=1)
        mask = np.stack([cols.masks[t.label_column] for t in schema.tasks], axis=1)
    else:
        labels, mask = np.zeros((B, 0), np.float32), np.zeros((B, 0), bool)
    return Batch(
        dense=_t(dense),
        sparse=sparse,
        sequences=seqs,
        labels=_t(labels.astype(np.float32, copy=False)),
        label_mask=_t(mask),
        surface=_t(cols.scalars[schema.surface_column]),
        example_id=_t(cols.scalars[schema.example_id_column]),
        ts=_t(cols.scalars[schema.time_column]),
    )
