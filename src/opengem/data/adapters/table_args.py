"""Command-line options of ``opengem convert table``, apart from the importer so that ``opengem convert
--help`` lists them without importing it.
"""

from __future__ import annotations

import argparse

from opengem.data.adapters.infer import DEFAULT_HASH_BUCKETS, DEFAULT_MIN_COUNT
from opengem.data.adapters.sources import FORMATS
from opengem.data.adapters.table_split import MODES

TABLE = "table"
TABLE_ONLY = ("format", "label", "schema", "infer_schema", "schema_out", "columns", "time", "time_cuts",
              "split", "exact_holdout", "valid_frac", "test_frac", "seed", "surface", "min_count",
              "hash_buckets", "table_name", "no_shuffle", "encoders", "split_name")
TABLE_DEFAULTS = {"valid_frac": 0.1, "test_frac": 0.1, "seed": 0}


def table_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``opengem convert table`` (other datasets refuse them)."""
    g = parser.add_argument_group("convert table (your own data)")
    g.add_argument("--format", choices=FORMATS, help="table: source format")
    g.add_argument("--label", help="table: label(s), comma-separated: COL (0/1, empty = not observed) or "
                                   "NAME=COL OP NUMBER, OP one of >= > <= < == != "
                                   "(e.g. 'like=rating>=4', quoted)")
    g.add_argument("--schema", help="table: import spec TOML (as written by --infer-schema)")
    g.add_argument("--infer-schema", action="store_true",
                   help="table: infer the import spec from the source's column types and write it to "
                        "--schema-out (default: OUT.import.toml beside --out) for editing")
    g.add_argument("--schema-out", help="table: where --infer-schema writes the spec")
    g.add_argument("--columns", help="table: column names of headerless CSV/TSV, comma-separated")
    g.add_argument("--time", help="table: time column (integer or timestamp); default: row number")
    g.add_argument("--split", choices=MODES, help="table: time (with --time), random (default), or "
                                                  "files (--src SPLIT=PATH per split)")
    g.add_argument("--exact-holdout", action="store_true",
                   help="table: with --split random, or a split carved from --src train=PATH: hold out "
                        "exactly round(FRAC * N) rows, those with the smallest splitmix64(row number + "
                        "seed * 0x9E3779B97F4A7C15) (seed 0: the frappe_x1 adapter's rule), instead of "
                        "each row whose hash is below FRAC; costs a row count pass and 8 bytes a row of "
                        "that source in memory (800 MB per 100M rows); stored in the spec")
    g.add_argument("--time-cuts", help="table: --split time at fixed times VALID_START,TEST_START "
                                       "(train = ts < VALID_START ...) instead of quantiles")
    g.add_argument("--valid-frac", type=float, default=0.1, help="table: validation share (default 0.1)")
    g.add_argument("--test-frac", type=float, default=0.1, help="table: test share (default 0.1)")
    g.add_argument("--seed", type=int, default=0, help="table: split hash and shuffle seed (default 0)")
    g.add_argument("--surface", help="table: column whose values are the surfaces (default: one, 'all')")
    g.add_argument("--min-count", type=int, default=None,
                   help=f"table: values seen fewer times in train share the OOV row (default "
                        f"{DEFAULT_MIN_COUNT})")
    g.add_argument("--hash-buckets", type=int, default=None,
                   help=f"table: features with more values are hashed into this many rows (default "
                        f"{DEFAULT_HASH_BUCKETS})")
    g.add_argument("--name", dest="table_name", help="table: dataset name (default: the --out folder's name)")
    g.add_argument("--no-shuffle", action="store_true", help="table: keep the train rows in source order")
    g.add_argument("--encoders", metavar="DATASET",
                   help="table: new rows of the same log (the next day, to predict, evaluate or train on "
                        "with a run of DATASET): encode them with DATASET's fitted vocabularies and "
                        "statistics, fitting nothing, into one split of a dataset with DATASET's schema")
    g.add_argument("--split-name", choices=("train", "valid", "test"), default=None,
                   help="table, with --encoders: the split the new rows go into (default test)")
