"""Avazu CTR (Kaggle 2014), first 8,999 rows of train (split 8,087 / 480 / 432) -> canonical Parquet.

Split: train.csv -> train, dev.csv -> valid, test.csv -> test (the source repo's random split; dev
and test have no header but the same 24 columns). ``ts`` is the real timestamp of the ``hour``
column (YYMMDDHH, UTC, Unix seconds; a single hour in this sample, so ``ts`` does not order rows).
One surface ``all``; task ``click``.

All 21 categorical columns are sparse, re-indexed on the training file; ``hour`` becomes
``hour_of_day`` and ``weekday`` features; ``id`` (a uint64 string, unique per row) is not a feature.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

from opengem.data.adapters.common import (
    AdapterError,
    BadRows,
    encode_on_train,
    make_table,
    read_csv,
    require_files,
    sparse_specs,
    take_columns,
    write_dataset,
)
from opengem.data.schema import FeatureSchema

FILES = (("train", "train.csv"), ("valid", "dev.csv"), ("test", "test.csv"))
COLUMNS = [
    "id", "click", "hour", "C1", "banner_pos", "site_id", "site_domain", "site_category", "app_id",
    "app_domain", "app_category", "device_id", "device_ip", "device_model", "device_type",
    "device_conn_type", "C14", "C15", "C16", "C17", "C18", "C19", "C20", "C21",
]
CATS = [c for c in COLUMNS if c not in ("id", "click", "hour")]
SPLIT_RULE = ("train = train.csv, valid = dev.csv, test = test.csv (source repo's random split); "
              "ts = Unix seconds of the hour column")


def read_split(path: Path, header: bool, limit: int | None, bad: BadRows | None = None) -> pa.Table:
    read = pcsv.ReadOptions(column_names=None if header else COLUMNS, autogenerate_column_names=False)
    types = {c: pa.string() for c in COLUMNS}
    types["click"] = pa.int64()
    convert = pcsv.ConvertOptions(column_types=types, strings_can_be_null=True)
    table = read_csv(path, bad or BadRows(), "not Avazu CSV", read, convert_options=convert)
    if table.column_names != COLUMNS:
        raise AdapterError(f"{path}: columns {table.column_names} are not the 24 Avazu columns")
    if limit is not None:
        table = table.slice(0, limit)
    if table["click"].null_count or not np.isin(table["click"].to_numpy(), (0, 1)).all():
        raise AdapterError(f"{path}: column 'click' must be 0/1 everywhere")
    return table


def hour_to_unix(hour: pa.ChunkedArray, where: str) -> np.ndarray:
    """YYMMDDHH strings -> Unix seconds (UTC)."""
    if hour.null_count:
        raise AdapterError(f"{where}: column 'hour' has {hour.null_count} empty values")
    uniq, inv = np.unique(hour.to_numpy(zero_copy_only=False).astype(str), return_inverse=True)
    try:
        days = np.array([f"20{x[:2]}-{x[2:4]}-{x[4:6]}" for x in uniq], dtype="datetime64[D]")
        hh = np.array([int(x[6:8]) for x in uniq], dtype=np.int64)
    except ValueError:
        days, hh = None, None
    bad = [x for x in uniq if len(x) != 8 or not x.isdigit()]
    if days is None or bad or (hh > 23).any():
        raise AdapterError(f"{where}: column 'hour' must be YYMMDDHH (e.g. {bad[:1] or uniq[:1]})")
    return (days.astype("datetime64[s]").astype(np.int64) + 3600 * hh)[inv.ravel()]


def convert(src: str | Path, out: str | Path, limit: int | None = None,
            force: bool = False) -> dict[str, Any]:
    src = Path(src)
    require_files(src, [f for _, f in FILES])
    bad = BadRows()
    parts = [read_split(src / f, i == 0, limit, bad) for i, (_, f) in enumerate(FILES)]
    split = np.concatenate([np.full(p.num_rows, i) for i, p in enumerate(parts)])
    table = pa.concat_tables(parts)
    train = split == 0
    n = table.num_rows
    ts = hour_to_unix(table["hour"], str(src))
    cols: dict[str, Any] = {
        "example_id": np.arange(n, dtype=np.int64), "ts": ts,
        "surface": np.zeros(n, np.int32), "click": table["click"].to_numpy().astype(np.float32),
    }
    vocabs: dict[str, int] = {}
    for c in CATS:
        cols[c], vocabs[c] = encode_on_train(table[c], train)
    # Fixed vocabularies: every hour / weekday is known a priori, so none is out of vocabulary.
    cols["hour_of_day"] = (ts // 3600) % 24 + 1
    vocabs["hour_of_day"] = 25
    cols["weekday"] = (ts // 86400 + 3) % 7 + 1  # 1970-01-01 was a Thursday; Monday = 1
    vocabs["weekday"] = 8
    schema = FeatureSchema.from_dict({
        "name": "avazu_head", "surfaces": ["all"], "sparse": sparse_specs(vocabs),
        "task": [{"name": "click"}],
    }, source="avazu_head adapter")
    tables = {name: make_table(schema, take_columns(cols, np.flatnonzero(split == i)), f"avazu/{name}")
              for i, (name, _) in enumerate(FILES)}
    return write_dataset(out, schema, tables, SPLIT_RULE, extra={"source": str(src), "limit": limit},
                         force=force, bad=bad)
