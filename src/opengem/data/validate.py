"""``opengem validate``: check every file of a dataset against its schema and list every problem.

Uses the loader's own checks (``parquet.check_columns``) in record-only mode, so "validate passes" means
exactly "the loader will read this without raising or repairing anything". Problems a schema policy would
repair (hash, clamp, zero, truncate) are listed too: they are still deviations from the declared data.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from opengem.data.dataset import Dataset, DatasetError
from opengem.data.parquet import Columns, DataError, ProblemLog, check_columns, inspect_file, read_row_group
from opengem.data.schema import FeatureSchema, SchemaError


def validate_files(files: list[Path], schema: FeatureSchema, keep: int = 100) -> tuple[ProblemLog, int]:
    """(problems, rows checked) over ``files``; reads one row group at a time."""
    log = ProblemLog(raise_errors=False, keep=keep)
    rows = 0
    for f in files:
        try:
            info = inspect_file(f, schema)
        except DataError as e:
            log.add(e.file, e.column, e.what, "error", None if e.row is None else _rows(e.row))
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="dataset folder (schema.toml + partitions)")
    p.add_argument("--schema", default=None, help="schema TOML (default: DATA/schema.toml)")
    p.add_argument("--max-problems", type=int, default=100,
                   help="print at most this many individual problems (all are counted)")
    p.add_argument("--partitions", default="@all", help="partition spec, e.g. 'day=00[0-4]' or @last")


def run(args: argparse.Namespace) -> int:
    try:
        schema = FeatureSchema.load(args.schema) if args.schema else None
        ds = Dataset(args.data, schema)
        files = ds.files(args.partitions) if ds.partitions() else []
    except (SchemaError, DatasetError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not files:
        print(f"error: {args.data}: no Parquet files", file=sys.stderr)
        return 2
    log, rows = validate_files(files, ds.schema, keep=max(0, args.max_problems))
    if not log.counts:
        print(f"OK: {len(files)} file(s), {rows} rows match schema {ds.schema.name!r}")
        return 0
    for p in log.samples:
        print(p)
    if log.total > len(log.samples):
        print(f"... {log.total - len(log.samples)} more problem(s) not listed (--max-problems)")
    print(log.report())
    print(f"FAILED: {log.total} problem(s) in {len(files)} file(s)", file=sys.stderr)
    return 1
