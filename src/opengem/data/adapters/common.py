"""Shared pieces of the real-dataset adapters: vocabularies, user histories, source reading, writing.

Every adapter re-indexes categoricals on its *training* split only, because a vocabulary that has
seen valid/test values leaks the future into the embedding tables; id 0 is reserved for anything the
training split never showed (unknown, out-of-vocabulary, missing), so valid/test never go out of vocab.

Source rows that cannot be parsed (a file cut mid-line, a row with too few or too many fields) are
skipped and counted per file in :class:`BadRows`, which ends up in summary.json (``bad_rows``) and on
the ``convert`` command's output: never dropped silently, never a crash. The dataset itself is written
through :func:`opengem.data.commit.staged_dir`: built in a temporary sibling and renamed into place with
its completion markers, so a failed or interrupted conversion leaves the previous output untouched.
"""

from __future__ import annotations

import json
import re
import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from opengem.data.commit import staged_dir
from opengem.data.dataset import arrow_schema
from opengem.data.schema import FeatureSchema
from opengem.errors import OpengemError

SPLITS = ("train", "valid", "test")


class AdapterError(OpengemError, ValueError):
    """Source files that do not look like the dataset the adapter was written for."""


# --------------------------------------------------------------------------- reading sources
SHOW_CHARS = 80  # how much of a source row an error message shows
ALL_SKIPPED_LINES = 1_000_000  # per file: past this many skipped rows, later rows are placed by count only


@dataclass
class BadRows:
    """Source rows skipped because they could not be parsed, per file: count, first line numbers, samples.

    A malformed row that is not UTF-8 (binary garbage, another encoding) cannot be skipped: pyarrow decodes
    the row's text before it calls the handler, and when that fails it prints the UnicodeDecodeError as an
    "Exception ignored" traceback and stops the read with a parse error that quotes the raw bytes. So every
    handler is registered with :func:`_watch`, whose ``sys.unraisablehook`` keeps that error here
    (``not_text``) instead of printing it, and :meth:`failure` turns the parse error that follows into a
    line that shows the row (decoded with replacement characters, truncated, in repr() form).
    """

    keep: int = 5
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    not_text: dict[str, UnicodeDecodeError] = field(default_factory=dict, repr=False)
    # every skipped line of a file in order (not reported): a later message names a row's line, which
    # counts the skipped rows above it (:class:`opengem.data.adapters.table_encode.RowPlace`)
    skipped: dict[str, list[int]] = field(default_factory=dict, repr=False)

    def handler(self, path: str | Path) -> Callable[[Any], str]:
        """A pyarrow ``invalid_row_handler`` that records the row and skips it."""
        def on_invalid(row: Any) -> str:
            rec = self.files.setdefault(str(path), {"rows": 0, "lines": [], "samples": []})
            rec["rows"] += 1
            lines = self.skipped.setdefault(str(path), [])
            if len(lines) < ALL_SKIPPED_LINES:
                lines.append(row.number)
            if len(rec["lines"]) < self.keep:
                rec["lines"].append(row.number)
                rec["samples"].append(f"expected {row.expected_columns} fields, got {row.actual_columns}: "
                                      f"{show_row(row.text)}")
            return "skip"
        _watch(on_invalid, self, str(path))
        return on_invalid

    def failure(self, path: str | Path, error: Exception) -> str:
        """Why reading ``path`` stopped with ``error`` (pyarrow's), for an AdapterError: the row that is not
        UTF-8 when that was the cause, else pyarrow's message with control characters escaped."""
        err = self.not_text.get(str(path))
        if err is None:
            return printable(str(error))
        row = re.search(r"Row #(\d+)", str(error))
        where = f"row {row.group(1)}" if row else "a row"
        return (f"{where} is not UTF-8 text ({err.reason} at byte {err.start}): {show_row(err.object)}; is "
                "the file binary, compressed or in another encoding? Save it as UTF-8 CSV")

    @property
    def total(self) -> int:
        return sum(r["rows"] for r in self.files.values())

    def report(self) -> dict[str, Any]:
        return {"total": self.total, "files": self.files}


def bad_rows_line(report: dict[str, Any]) -> str:
    """One line from ``BadRows.report()``, e.g. ``2 in /src/train.tsv (lines 8001, 8002)``."""
    def one(f: str, r: dict[str, Any]) -> str:
        lines = ", ".join(str(n) for n in r["lines"]) + (", ..." if r["rows"] > len(r["lines"]) else "")
        return f"{r['rows']} in {f} (line{'s' if r['rows'] > 1 else ''} {lines})"
    return "; ".join(one(f, r) for f, r in report["files"].items())


_WATCHED: weakref.WeakKeyDictionary[Callable[[Any], str], tuple[BadRows, str]] = weakref.WeakKeyDictionary()


def _watch(handler: Callable[[Any], str], bad: BadRows, path: str) -> None:
    """Send the UnicodeDecodeError pyarrow reports for ``handler``'s row to ``bad`` instead of stderr.

    The hook is installed once per process (again if someone replaced it since) and hands every other
    unraisable error to the hook it found; a handler leaves ``_WATCHED`` when pyarrow drops it.
    """
    _WATCHED[handler] = (bad, path)
    if getattr(sys.unraisablehook, "_opengem_invalid_rows", False):
        return
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        try:
            owner = _WATCHED.get(unraisable.object)
        except TypeError:  # not weak-referenceable: not one of ours
            owner = None
        if owner is not None and isinstance(unraisable.exc_value, UnicodeDecodeError):
            owner[0].not_text.setdefault(owner[1], unraisable.exc_value)
        else:
            previous(unraisable)

    hook._opengem_invalid_rows = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def read_csv(path: Path, bad: BadRows, what: str, read_options: pcsv.ReadOptions | None = None,
             parse_options: pcsv.ParseOptions | None = None,
             convert_options: pcsv.ConvertOptions | None = None) -> pa.Table:
    """``pyarrow.csv.read_csv`` that skips and counts malformed rows in ``bad`` (single-threaded, so
    every skipped row has its line number) and turns any other parse error into an AdapterError (a row
    that is not UTF-8 included: see :class:`BadRows`)."""
    read_options = read_options or pcsv.ReadOptions()
    read_options.use_threads = False
    parse_options = parse_options or pcsv.ParseOptions()
    parse_options.invalid_row_handler = bad.handler(path)
    try:
        return pcsv.read_csv(path, read_options=read_options, parse_options=parse_options,
                             convert_options=convert_options or pcsv.ConvertOptions())
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise AdapterError(f"{path}: {what}: {bad.failure(path, e)}") from None


def show_row(raw: bytes | str) -> str:
    """A source row for a message: decoded with replacement characters, truncated, in repr() form."""
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    return repr(text[:SHOW_CHARS]) + ("..." if len(text) > SHOW_CHARS else "")


def printable(message: str, limit: int = 400) -> str:
    """``message`` with control characters escaped and cut to ``limit`` characters (pyarrow quotes a bad
    row's raw text in its errors)."""
    out = "".join(c if c.isprintable() or c == "\n" else c.encode("unicode_escape").decode("ascii")
                  for c in message[:limit])
    return out + ("..." if len(message) > limit else "")


def read_parquet(path: Path, columns: list[str] | None = None) -> pa.Table:
    """A source Parquet file, or an AdapterError naming it (a truncated copy has no footer)."""
    try:
        return pq.read_table(path, columns=columns)
    except (pa.ArrowInvalid, OSError) as e:
        raise AdapterError(f"{path}: not a readable Parquet file (cut short or corrupt?): {e}") from None


# --------------------------------------------------------------------------- vocabularies
@dataclass(frozen=True)
class Vocab:
    """Sorted distinct training values; value ``values[i]`` gets id ``i + 1`` and 0 means unknown."""

    values: pa.Array

    @classmethod
    def fit(cls, arr: pa.Array | pa.ChunkedArray) -> Vocab:
        if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
            arr = pc.list_flatten(arr)
        uniq = pc.unique(arr).drop_null()
        if isinstance(uniq, pa.ChunkedArray):
            uniq = uniq.combine_chunks()
        return cls(uniq.take(pc.sort_indices(uniq)))

    @property
    def size(self) -> int:
        return len(self.values) + 1

    def encode(self, arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
        idx = pc.index_in(arr, value_set=self.values)
        return pc.fill_null(idx, -1).to_numpy(zero_copy_only=False).astype(np.int64) + 1

    def encode_list(self, arr: pa.Array | pa.ChunkedArray) -> pa.Array:
        """Encode a list<...> column element-wise, keeping its row structure (null rows -> [])."""
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        arr = pc.fill_null(arr, pa.scalar([], arr.type))
        ids = self.encode(pc.list_flatten(arr))
        offsets = pc.subtract(arr.offsets, arr.offsets[0])
        return pa.ListArray.from_arrays(offsets, pa.array(ids, pa.int64()))


def encode_on_train(arr: pa.Array | pa.ChunkedArray, train_mask: np.ndarray) -> tuple[np.ndarray, int]:
    """Fit a vocabulary on the training rows of a scalar column and encode every row."""
    vocab = Vocab.fit(arr.filter(pa.array(train_mask)))
    return vocab.encode(arr), vocab.size


def encode_list_on_train(arr: pa.Array | pa.ChunkedArray, train_mask: np.ndarray) -> tuple[pa.Array, int]:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    vocab = Vocab.fit(arr.filter(pa.array(train_mask)))
    return vocab.encode_list(arr), vocab.size


def log1p_dense(arr: pa.Array | pa.ChunkedArray | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``log1p(max(x, 0))`` with missing -> 0, plus a 0/1 missingness indicator.

    Returning the indicator lets a model tell "missing" from "zero", which a bare 0 fill hides.
    """
    if isinstance(arr, np.ndarray):
        x = arr.astype(np.float64)
    else:
        x = pc.cast(arr, pa.float64()).to_numpy(zero_copy_only=False)
    missing = ~np.isfinite(x)
    x = np.where(missing, 0.0, np.log1p(np.maximum(np.nan_to_num(x, nan=0.0), 0.0)))
    return x.astype(np.float32), missing.astype(np.float32)


# --------------------------------------------------------------------------- histories
@dataclass(frozen=True)
class History:
    """Per-row user histories as gather indices: row r's events are ``events[offsets[r]:offsets[r+1]]``.

    ``events`` index the source rows (oldest first); ``n_earlier`` counts all strictly earlier events
    before truncation to ``max_len``; ``rows`` are the source rows the histories belong to.
    """

    offsets: np.ndarray
    events: np.ndarray
    n_earlier: np.ndarray
    rows: np.ndarray

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def field(self, values: np.ndarray) -> pa.Array:
        """A list column of ``values`` (indexed by source row) over each row's history."""
        offsets = pa.array(self.offsets.astype(np.int32))
        return pa.ListArray.from_arrays(offsets, pa.array(values[self.events]))

    def time_delta_hours(self, ts: np.ndarray, seconds_per_unit: float = 1.0) -> pa.Array:
        """``log1p`` hours between each row and each of its history events (always > 0)."""
        row_ts = np.repeat(ts[self.rows], self.lengths())
        dt = (row_ts - ts[self.events]).astype(np.float64) * (seconds_per_unit / 3600.0)
        flat = np.log1p(np.maximum(dt, 0.0)).astype(np.float32)
        return pa.ListArray.from_arrays(pa.array(self.offsets.astype(np.int32)), pa.array(flat, pa.float32()))

    def take(self, rows: np.ndarray) -> History:
        """The histories of a subset of rows (in the given order), still indexing the source rows."""
        lens = self.lengths()[rows]
        offsets = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(lens, out=offsets[1:])
        starts = self.offsets[:-1][rows]
        idx = np.repeat(starts - offsets[:-1], lens) + np.arange(offsets[-1])
        return History(offsets, self.events[idx], self.n_earlier[rows], self.rows[rows])


def build_history(user: np.ndarray, ts: np.ndarray, max_len: int) -> History:
    """For every row, the same user's events with a strictly smaller ``ts``: the last ``max_len``.

    Vectorised: sort by (user, ts) stably, so a row's strictly earlier events are exactly the sorted
    positions between its user's first position and the first position of its own (user, ts) run;
    ties in ``ts`` are therefore never in each other's history (same-time events are not "earlier").
    Among earlier events with equal ts, the source row order decides the order.
    """
    n = len(user)
    if len(ts) != n:
        raise AdapterError(f"history: user ({n}) and ts ({len(ts)}) lengths differ")
    order = np.lexsort((ts, user))
    su, st = user[order], ts[order]
    pos = np.arange(n)
    new_user = np.ones(n, bool)
    new_user[1:] = su[1:] != su[:-1]
    new_run = new_user.copy()
    new_run[1:] |= st[1:] != st[:-1]
    user_start = np.maximum.accumulate(np.where(new_user, pos, 0)) if n else pos
    run_start = np.maximum.accumulate(np.where(new_run, pos, 0)) if n else pos
    begin = np.maximum(user_start, run_start - max_len)
    lens_sorted = run_start - begin
    lens = np.empty(n, np.int64)
    starts = np.empty(n, np.int64)
    n_earlier = np.empty(n, np.int64)
    lens[order] = lens_sorted
    starts[order] = begin
    n_earlier[order] = run_start - user_start
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    idx_sorted = np.repeat(starts - offsets[:-1], lens) + np.arange(offsets[-1])
    return History(offsets, order[idx_sorted], n_earlier, np.arange(n))


def first_users_limit(user: np.ndarray, limit: int | None) -> np.ndarray:
    """Row mask keeping the users with the smallest ids whose rows total at most ``limit``.

    A per-user cut (not a row cut) keeps every kept user's full timeline, so histories stay exact and
    every time split still gets rows.
    """
    if limit is None:
        return np.ones(len(user), bool)
    uniq, counts = np.unique(user, return_counts=True)
    keep = uniq[np.cumsum(counts) <= limit]
    if len(keep) == 0:
        keep = uniq[:1]
    return np.isin(user, keep)


# --------------------------------------------------------------------------- writing
def make_table(schema: FeatureSchema, columns: Mapping[str, Any], where: str) -> pa.Table:
    """A table with exactly ``arrow_schema(schema)``; a missing or ragged column is a clear error."""
    target = arrow_schema(schema)
    arrays = []
    n = None
    for f in target:
        if f.name not in columns:
            raise AdapterError(f"{where}: adapter produced no column {f.name!r}")
        col = columns[f.name]
        arr = col if isinstance(col, (pa.Array, pa.ChunkedArray)) else pa.array(col)
        arr = arr.cast(f.type)
        if n is None:
            n = len(arr)
        elif len(arr) != n:
            raise AdapterError(f"{where}: column {f.name!r} has {len(arr)} rows, expected {n}")
        if not f.nullable and arr.null_count:
            raise AdapterError(f"{where}: column {f.name!r} has {arr.null_count} nulls")
        arrays.append(arr)
    return pa.Table.from_arrays(arrays, schema=target)


def take_columns(columns: Mapping[str, Any], rows: np.ndarray) -> dict[str, Any]:
    """Row subset of a dict of numpy arrays / Arrow arrays."""
    idx = pa.array(rows, pa.int64())
    out: dict[str, Any] = {}
    for k, v in columns.items():
        out[k] = v[rows] if isinstance(v, np.ndarray) else v.take(idx)
    return out


def label_rates(schema: FeatureSchema, table: pa.Table) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for t in schema.tasks:
        m = pc.mean(table[t.label_column]).as_py()
        out[t.name] = None if m is None else round(float(m), 6)
    return out


def write_dataset(
    out: str | Path,
    schema: FeatureSchema,
    tables: Mapping[str, pa.Table],
    split_rule: str,
    extra: Mapping[str, Any] | None = None,
    *,
    force: bool = False,
    bad: BadRows | None = None,
    writer: str = "opengem convert",
) -> dict[str, Any]:
    """Write schema.toml, ``<split>/part-00000.parquet`` for each split (in order) and summary.json.

    Built in a temporary sibling of ``out`` and renamed into place with completion markers; ``out``
    must be missing or empty unless ``force`` (which replaces a dataset there once the new one is
    complete). ``bad``: the source rows skipped while reading, recorded as ``bad_rows``.
    """
    target = arrow_schema(schema)
    for name, table in tables.items():
        if not table.schema.equals(target):
            raise AdapterError(f"{out}/{name}: table schema differs from arrow_schema(schema)")
    empty = [name for name, table in tables.items() if table.num_rows == 0]
    if empty:  # a dataset its own validate refuses, which training would fail on: said before it is written
        several = len(empty) > 1
        raise AdapterError(f"{out}: the {' and '.join(empty)} split{'s' if several else ''} would have no "
                           f"rows ({split_rule}); the source ends before {'them' if several else 'it'}: "
                           "convert more of it (a larger --limit, or the whole log)")
    splits: dict[str, Any] = {}
    for name, table in tables.items():
        ts = table[schema.time_column]
        splits[name] = {
            "rows": table.num_rows,
            "label_rates": label_rates(schema, table),
            "ts_min": pc.min(ts).as_py(),
            "ts_max": pc.max(ts).as_py(),
        }
    summary: dict[str, Any] = {
        "dataset": schema.name,
        "partitions": list(tables),
        "split_rule": split_rule,
        "rows": sum(s["rows"] for s in splits.values()),
        "splits": splits,
        "vocab": {f.name: f.vocab for f in schema.sparse},
        "bad_rows": (bad or BadRows()).report(),
    }
    summary.update(extra or {})
    with staged_dir(out, writer=f"{writer} {schema.name}", force=force) as st:
        for name, table in tables.items():
            (st.path / name).mkdir()
            pq.write_table(table, st.path / name / "part-00000.parquet")
        schema.save(st.path / "schema.toml")
        (st.path / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        st.record["bad_rows"] = summary["bad_rows"]["total"]
    return summary


def sparse_specs(vocabs: Mapping[str, int], dims: Mapping[str, int] | None = None,
                 multi: Sequence[str] = (), tables: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Schema ``[[sparse]]`` entries; dims default to a size-aware rule (small vocab, small dim)."""
    out = []
    for name, v in vocabs.items():
        dim = (dims or {}).get(name) or (4 if v <= 16 else 8 if v <= 256 else 16)
        d: dict[str, Any] = {"name": name, "vocab": int(v), "dim": dim}
        if name in multi:
            d.update(multi_valued=True, pooling="mean")
        if tables and name in tables:
            d["table"] = tables[name]
        out.append(d)
    return out


def require_files(src: Path, names: Sequence[str]) -> None:
    if not Path(src).is_dir():
        raise AdapterError(f"{src}: no such folder (--src names the folder that holds {', '.join(names)})")
    missing = [n for n in names if not (src / n).exists()]
    if missing:
        raise AdapterError(f"{src}: missing source file(s) {', '.join(missing)}")
