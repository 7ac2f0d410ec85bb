"""``opengem validate``: check every file of a dataset against its schema and list every problem.

Uses the loader's own checks (``parquet.check_columns``) in record-only mode, so "validate passes" means
exactly "the loader will read this without raising or repairing anything". Problems a schema policy would
repair (hash, clamp, zero, truncate) are listed too: they are still deviations from the declared data.

Two problems no single row shows are checked across the dataset too (:func:`check_integrity`): an
``example_id`` seen twice (the loader would train or score that example twice, and knowledge tables keyed
by id would be ambiguous), and, on day partitions, a row earlier than the latest row of an earlier day
(days that overlap in time make "train on the past, evaluate on the future" a leak).

A dataset or selected partition without its completion marker (:mod:`opengem.data.commit`) is a problem
as well, since every reader refuses it; ``--mark-complete`` writes the markers instead, and only after
a validation of every partition that found nothing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from opengem.data.commit import MARK_HINT, MARKER, mark_complete
from opengem.data.dataset import Dataset, DatasetError
from opengem.data.parquet import (
    Columns,
    DataError,
    ProblemLog,
    check_columns,
    inspect_file,
    open_parquet,
    read_row_group,
)
from opengem.data.schema import FeatureSchema
from opengem.data.splits import TIME, layout
from opengem.errors import UsageError


def validate_files(files: list[Path], schema: FeatureSchema, keep: int = 100) -> tuple[ProblemLog, int]:
    """(problems, rows checked) over ``files``; reads one row group at a time."""
    log = ProblemLog(raise_errors=False, keep=keep)
    rows = 0
    for f in files:
        try:
            info = inspect_file(f, schema)
        except DataError as e:
            for p in (e, *e.also):  # every missing or mistyped column of the file, not only the first
                log.add(p.file, p.column, p.what, "error", None if p.row is None else _rows(p.row))
            continue
        start = 0
        for rg, n in enumerate(info.row_groups):
            try:
                table = read_row_group(info, rg, schema)
            except DataError as e:
                log.add(e.file, e.column, e.what, "error", None if e.row is None else _rows(e.row))
                start += n
                continue
            check_columns(Columns.from_arrow(table, schema, start), schema, info.path, log, "error")
            rows += n
            start += n
    return log, rows


def _rows(row: int) -> np.ndarray:
    return np.array([row], dtype=np.int64)


def _id_ts_chunks(files: list[Path], schema: FeatureSchema) -> Iterator[tuple[Path, np.ndarray, np.ndarray,
                                                                              np.ndarray]]:
    """(file, rows within the file, example ids, ts) per row group, reading only those two columns.

    Files, row groups and null values the schema checks already reported as unreadable are passed over.
    """
    cols = [schema.example_id_column, schema.time_column]
    for f in files:
        try:
            pf = open_parquet(f)
        except DataError:
            continue
        start = 0
        for rg in range(pf.metadata.num_row_groups):
            n = pf.metadata.row_group(rg).num_rows
            try:
                t = pf.read_row_group(rg, columns=cols)
                ok = np.ones(n, dtype=bool)
                for c in cols:
                    ok &= np.asarray(t.column(c).is_valid().to_numpy(zero_copy_only=False), dtype=bool)
                ids = np.asarray(t.column(cols[0]).cast(pa.int64()).fill_null(0).to_numpy(), dtype=np.int64)
                ts = np.asarray(t.column(cols[1]).cast(pa.int64()).fill_null(0).to_numpy(), dtype=np.int64)
            except (KeyError, OSError, pa.ArrowException):
                start += n
                continue
            yield f, start + np.flatnonzero(ok), ids[ok], ts[ok]
            start += n


def _short(f: Path) -> str:
    """``partition/file``: enough to find a file inside the dataset being validated."""
    return f"{f.parent.name}/{f.name}"


def check_integrity(parts: list[tuple[str, list[Path]]], schema: FeatureSchema, log: ProblemLog,
                    time_ordered: bool) -> None:
    """Duplicate example ids across and within ``parts`` and, when ``time_ordered`` (day partitions, in
    day order), rows whose ts is earlier than the latest ts of any earlier partition; into ``log``.

    Streams one row group's two columns at a time; keeps every id (8 bytes a row) to find duplicates,
    then reads the ids again only when there are some, to name where each value was first seen.
    """
    id_col, ts_col = schema.example_id_column, schema.time_column
    files = [f for _, fs in parts for f in fs]
    seen: list[np.ndarray] = []
    latest: tuple[int, Path, int] | None = None  # (max ts of the earlier partitions, its file, its row)
    for _, fs in parts:
        here: tuple[int, Path, int] | None = None
        for f, rows, ids, ts in _id_ts_chunks(fs, schema):
            seen.append(ids)
            if not len(ts):
                continue
            if time_ordered and latest is not None:
                early = np.flatnonzero(ts < latest[0])
                if len(early):
                    what = (f"earlier than ts {latest[0]} at {_short(latest[1])} row {latest[2]} "
                            "(an earlier day): day partitions overlap in time")
                    log.add(f, ts_col, what, "error", rows[early], ts[early])
            i = int(np.argmax(ts))
            if here is None or ts[i] > here[0]:
                here = (int(ts[i]), f, int(rows[i]))
        if here is not None and (latest is None or here[0] > latest[0]):
            latest = here
    if not seen:
        return
    ids = np.sort(np.concatenate(seen))
    dup = np.unique(ids[1:][ids[1:] == ids[:-1]])
    if not len(dup):
        return
    first: dict[int, tuple[Path, int]] = {}
    for f, rows, ids, _ in _id_ts_chunks(files, schema):
        hit = np.flatnonzero(np.isin(ids, dup))
        again, detail = [], []
        for j in hit:
            v = int(ids[j])
            if v in first:
                again.append(rows[j])
                detail.append(f"{v}; first at {_short(first[v][0])} row {first[v][1]}")
            else:
                first[v] = (f, int(rows[j]))
        if again:
            log.add(f, id_col, "duplicate example_id", "error", np.array(again, dtype=np.int64),
                    np.array(detail))


def _by_partition(root: Path, files: list[Path]) -> list[tuple[str, list[Path]]]:
    """``files`` (in the dataset's selection order: days in day order) grouped by partition folder."""
    out: dict[str, list[Path]] = {}
    for f in files:
        out.setdefault(f.parent.relative_to(root).as_posix(), []).append(f)
    return list(out.items())


def marker_problems(ds: Dataset, parts: list[str], log: ProblemLog) -> None:
    """A dataset (or selected partition) without its completion marker: readers refuse it, so validate
    must not say OK (``--mark-complete`` writes the markers instead, after a clean validation)."""
    hint = f"`{MARK_HINT.format(path=ds.root)}` after a clean validation"
    if ds.marker is None:
        log.add(ds.root / MARKER, None, f"missing or not opengem's: readers refuse this dataset; if it is "
                f"finished, mark it with {hint}", "error")
        return
    for part in parts:
        if not ds.partition_complete(part):
            log.add(ds.root / part / MARKER, None, f"missing and {MARKER} of the dataset does not list "
                    f"{part}: readers refuse it; if it is finished, mark it with {hint}", "error")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="dataset folder (schema.toml + partitions)")
    p.add_argument("--schema", default=None, help="schema TOML (default: DATA/schema.toml)")
    p.add_argument("--max-problems", type=int, default=100,
                   help="print at most this many individual problems (all are counted)")
    p.add_argument("--partitions", default="@all",
                   help="partition spec, e.g. 'day=00[0-4]', @train or @valid (default @all)")
    p.add_argument("--mark-complete", action="store_true",
                   help=f"after a clean validation of every partition, write the {MARKER} markers that "
                        "readers require (for a dataset assembled by hand)")


def run(args: argparse.Namespace) -> int:
    if args.mark_complete and args.partitions.strip() != "@all":
        raise UsageError(f"--mark-complete marks the whole dataset, so it validates every partition: drop "
                         f"--partitions {args.partitions!r}")
    schema = FeatureSchema.load(args.schema) if args.schema else None
    ds = Dataset(args.data, schema, require_complete=False)
    files = ds.files(args.partitions) if ds.partitions() else []
    if not files:
        raise DatasetError(f"{ds.root}: no partition folder holds a Parquet file: nothing to validate")
    log = ProblemLog(raise_errors=False, keep=max(0, args.max_problems))
    parts = _by_partition(ds.root, files)
    if not args.mark_complete:
        marker_problems(ds, [p for p, _ in parts], log)
    files_log, rows = validate_files(files, ds.schema, keep=max(0, args.max_problems - len(log.samples)))
    log.merge(files_log.counts, files_log.samples)
    check_integrity(parts, ds.schema, log, time_ordered=layout([p for p, _ in parts]) == TIME)
    if not log.counts:
        print(f"OK: {len(files)} file(s), {rows} rows match schema {ds.schema.name!r}")
        if args.mark_complete:
            mark_complete(ds.root)
            print(f"marked complete: {ds.root / MARKER}")
        return 0
    for p in log.samples:
        print(p)
    if log.total > len(log.samples):
        print(f"... {log.total - len(log.samples)} more problem(s) not listed (--max-problems)")
    print(log.report())
    not_marked = " (not marked complete)" if args.mark_complete else ""
    print(f"FAILED: {log.total} problem(s) in {len(files)} file(s){not_marked}", file=sys.stderr)
    return 1
