"""Real-dataset adapters: ``opengem convert NAME --src PATH --out DIR``.

Each adapter module exposes ``convert(src, out, limit=None, ...) -> summary dict`` and writes a
canonical dataset (schema.toml, ``<split>/part-00000.parquet``, summary.json). Modules are imported
only when their dataset is converted.
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
            max_len: int | None = None) -> dict[str, Any]:
    fn, has_max_len = get_adapter(name)
    src = Path(src) if src is not None else data_root() / name
    kwargs: dict[str, Any] = {"limit": limit}
    if max_len is not None:
        if not has_max_len:
            raise ValueError(f"{name}: --max-len applies only to datasets with histories")
        kwargs["max_len"] = max_len
    return fn(src, out, **kwargs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=sorted(ADAPTERS), help="dataset to convert")
    parser.add_argument("--src", default=None,
                        help="source folder (default: $OPENGEM_DATA/NAME or <repo>/../shared/data/NAME)")
    parser.add_argument("--out", required=True, help="output dataset folder")
    parser.add_argument("--limit", type=int, default=None,
                        help="convert a subset of about N rows (per source file, or whole users for "
                             "datasets with histories) for quick tests")
    parser.add_argument("--max-len", type=int, default=None, help="history length (sequence datasets)")


def run(args: argparse.Namespace) -> int:
    from opengem.data.adapters.common import AdapterError

    if args.limit is not None and args.limit <= 0:
        print("--limit must be > 0", file=sys.stderr)
        return 2
    if args.max_len is not None and args.max_len <= 0:
        print("--max-len must be > 0", file=sys.stderr)
        return 2
    try:
        summary = convert(args.name, args.src, args.out, limit=args.limit, max_len=args.max_len)
    except (AdapterError, ValueError, FileNotFoundError) as e:
        print(f"convert {args.name}: {e}", file=sys.stderr)
        return 1
    brief = {k: {"rows": v["rows"], "label_rates": v["label_rates"]} for k, v in summary["splits"].items()}
    print(json.dumps({"out": str(args.out), "split_rule": summary["split_rule"], "splits": brief}, indent=2))
    return 0
