"""Real-dataset adapters: ``opengem convert NAME --src PATH --out DIR [--force]``, and one's own data:
``opengem convert table --src PATH_OR_GLOB --format csv|tsv|parquet|libsvm --label COL ...`` (see
:mod:`opengem.data.adapters.table`; imported only when used).

Each adapter module exposes ``convert(src, out, limit=None, ..., force=False) -> summary dict`` and
writes a canonical dataset (schema.toml, ``<split>/part-00000.parquet``, summary.json, completion
markers) through ``common.write_dataset``, which builds it in a temporary sibling folder and renames it
into place. ``--out`` must be missing or empty unless ``--force``, which replaces a dataset there only
once the new one is complete. Modules are imported only when their dataset is converted.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opengem.data.adapters.common import bad_rows_line
from opengem.data.adapters.table_args import TABLE, TABLE_DEFAULTS, TABLE_ONLY, table_arguments
from opengem.data.commit import check_target
from opengem.errors import UsageError

# name -> (module, function, whether it accepts max_len)
ADAPTERS: dict[str, tuple[str, str, bool]] = {
    "kuairand_pure": ("opengem.data.adapters.kuairand_pure", "convert", True),
    "frappe_x1": ("opengem.data.adapters.frappe_x1", "convert", False),
    "movielens_100k": ("opengem.data.adapters.movielens", "convert_100k", True),
    "movielens_latest_small": ("opengem.data.adapters.movielens", "convert_latest_small", True),
    "criteo_kaggle_head": ("opengem.data.adapters.criteo_kaggle_head", "convert", False),
    "avazu_head": ("opengem.data.adapters.avazu_head", "convert", False),
}


def data_root() -> Path:
    """Where real data lives: $OPENGEM_DATA, else ``<repo>/../shared/data``."""
    env = os.environ.get("OPENGEM_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[4].parent / "shared" / "data"


def get_adapter(name: str) -> tuple[Callable[..., dict[str, Any]], bool]:
    if name not in ADAPTERS:
        raise KeyError(f"unknown dataset {name!r} (known: {', '.join(ADAPTERS)})")
    module, func, has_max_len = ADAPTERS[name]
    return getattr(importlib.import_module(module), func), has_max_len


def convert(name: str, src: str | Path | None, out: str | Path, limit: int | None = None,
            max_len: int | None = None, force: bool = False) -> dict[str, Any]:
    fn, has_max_len = get_adapter(name)
    check_target(out, force)  # refuse before reading the source, not after
    src = Path(src) if src is not None else data_root() / name
    kwargs: dict[str, Any] = {"limit": limit, "force": force}
    if max_len is not None:
        if not has_max_len:
            raise UsageError(f"{name}: --max-len applies only to datasets with histories")
        kwargs["max_len"] = max_len
    return fn(src, out, **kwargs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=[*sorted(ADAPTERS), TABLE],
                        help="dataset to convert, or 'table' for your own CSV/TSV/Parquet/libsvm file(s)")
    parser.add_argument("--src", action="append", default=None,
                        help="source folder (default: $OPENGEM_DATA/NAME or <repo>/../shared/data/NAME); "
                             "table: a file or glob, or SPLIT=PATH once per split (repeatable)")
    parser.add_argument("--out", required=True, help="output dataset folder")
    parser.add_argument("--limit", type=int, default=None,
                        help="convert a subset of about N rows (per source file, or whole users for "
                             "datasets with histories) for quick tests")
    parser.add_argument("--max-len", type=int, default=None, help="history length (sequence datasets)")
    parser.add_argument("--force", action="store_true",
                        help="replace a dataset in --out (swapped in once the new one is complete)")
    table_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.name == TABLE:
        return importlib.import_module("opengem.data.adapters.table_cli").run(args)
    given = [k for k in TABLE_ONLY if getattr(args, k, None) not in (None, False, TABLE_DEFAULTS.get(k))]
    if given:
        raise UsageError(f"convert {args.name}: --{given[0].replace('_', '-')} applies only to "
                         "`opengem convert table`")
    if args.src is not None and len(args.src) > 1:
        raise UsageError(f"convert {args.name}: give --src once (a source folder)")
    args.src = args.src[0] if args.src else None
    if args.limit is not None and args.limit <= 0:
        raise UsageError(f"--limit must be > 0, got {args.limit}")
    if args.max_len is not None and args.max_len <= 0:
        raise UsageError(f"--max-len must be > 0, got {args.max_len}")
    summary = convert(args.name, args.src, args.out, limit=args.limit, max_len=args.max_len, force=args.force)
    brief = {k: {"rows": v["rows"], "label_rates": v["label_rates"]} for k, v in summary["splits"].items()}
    bad = summary["bad_rows"]
    print(json.dumps({"out": str(args.out), "split_rule": summary["split_rule"], "splits": brief,
                      "bad_rows": bad["total"]}, indent=2))
    if bad["total"]:
        print(f"convert {args.name}: warning: skipped {bad['total']} malformed source row(s): "
              f"{bad_rows_line(bad)} (listed in {Path(args.out) / 'summary.json'} under bad_rows)",
              file=sys.stderr)
    return 0
