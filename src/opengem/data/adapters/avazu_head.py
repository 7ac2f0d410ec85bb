"""Avazu CTR (Kaggle 2014), first 8,999 rows of train (split 8,087 / 480 / 432) -> canonical Parquet.

Split: train.csv -> train, dev.csv -> valid, test.csv -> test (the source repo's random split; dev
and test have no header but the same 24 columns). ``ts`` is the real timestamp of the ``hour``
column (YYMMDDHH, UTC, Unix seconds; a single hour in this sample, so ``ts`` does not order rows).
One surface ``all``; task ``click``.

All 21 categorical columns are sparse, indexed on the training file (id 0: the trained
out-of-vocabulary row of empty, rare and unseen values); ``hour`` becomes ``hour_of_day`` and
``weekday`` features with fixed vocabularies; ``id`` (a uint64 string, unique per row) is not a feature.

Converted through the generic importer's streaming path (``table``, with ``ts``, ``hour_of_day`` and
``weekday`` derived from each batch), so the same code converts the full public release in bounded
memory; train rows are shuffled within their split (seeded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from opengem.data.adapters.common import AdapterError, require_files
from opengem.data.adapters.infer import DEFAULT_MIN_COUNT, ImportSpec, SparseSpec
from opengem.data.adapters.sources import Source
from opengem.data.adapters.table import TableJob, convert_table
from opengem.data.adapters.table_split import SplitRule

FILES = (("train", "train.csv"), ("valid", "dev.csv"), ("test", "test.csv"))
COLUMNS = [
    "id", "click", "hour", "C1", "banner_pos", "site_id", "site_domain", "site_category", "app_id",
    "app_domain", "app_category", "device_id", "device_ip", "device_model", "device_type",
    "device_conn_type", "C14", "C15", "C16", "C17", "C18", "C19", "C20", "C21",
]
CATS = [c for c in COLUMNS if c not in ("id", "click", "hour")]
DERIVED = ("ts", "hour_of_day", "weekday")
SPLIT_RULE = ("train = train.csv, valid = dev.csv, test = test.csv (source repo's random split); "
              "ts = Unix seconds of the hour column")


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


def derive(batch: pa.RecordBatch, path: Path) -> pa.RecordBatch:
    """``ts`` from ``hour``, and the fixed-vocabulary ``hour_of_day`` (1..24) and ``weekday`` (1..7)."""
    ts = hour_to_unix(batch.column("hour"), str(path))
    cols = {"ts": ts, "hour_of_day": (ts // 3600) % 24 + 1,
            "weekday": (ts // 86400 + 3) % 7 + 1}  # 1970-01-01 was a Thursday; Monday = 1
    for name, values in cols.items():
        batch = batch.append_column(name, pa.array(values.astype(np.int64)))
    return batch


def spec(min_count: int = DEFAULT_MIN_COUNT) -> ImportSpec:
    # Fixed vocabularies: every hour / weekday is known a priori, so none is out of vocabulary.
    return ImportSpec(name="avazu_head", labels=["click"], time="ts", min_count=min_count,
                      ignore=["id", "hour"],
                      sparse=[*(SparseSpec(c) for c in CATS), SparseSpec("hour_of_day", vocab=25),
                              SparseSpec("weekday", vocab=8)])


def convert(src: str | Path, out: str | Path, limit: int | None = None,
            force: bool = False) -> dict[str, Any]:
    src = Path(src)
    require_files(src, [f for _, f in FILES])
    first = src / FILES[0][1]
    sources = {split: Source([src / f], "csv", None, header_file=first, limit=limit) for split, f in FILES}
    names = sources["train"].schema().names
    if names != COLUMNS:
        raise AdapterError(f"{first}: columns {names} are not the 24 Avazu columns")
    job = TableJob(sources, spec(), SplitRule("files"), derive=derive, derived=DERIVED, rule_text=SPLIT_RULE,
                   writer="opengem convert", extra={"source": str(src), "limit": limit})
    return convert_table(job, out, force=force)
