"""Frappe_x1 (BARS valid + test libsvm; the train split is not available) -> canonical Parquet.

Split: the published ``valid.libsvm`` is the training pool and ``test.libsvm`` the test set. A
deterministic 10 % of the valid rows (the ``round(0.1 * N)`` rows with the smallest splitmix64 hash of
their line number) is held out as ``valid`` for early stopping; the rest is ``train``; ``test`` =
test.libsvm. Frappe has no timestamps: ``ts`` is the line number (valid file first, then test), so
``ts`` orders rows but carries no time. One surface ``all``; task ``click``.

Each row is exactly 10 one-hot indices in fixed, consecutive ranges (SOURCE.md), decoded to 10
sparse features re-indexed on the training rows.
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
from opengem.data.adapters.vocab import splitmix64
from opengem.data.schema import FeatureSchema

FIELDS = (  # name, first index, number of values
    ("user", 0, 957), ("item", 957, 4082), ("daytime", 5039, 7), ("weekday", 5046, 7),
    ("isweekend", 5053, 2), ("homework", 5055, 3), ("cost", 5058, 2), ("weather", 5060, 9),
    ("country", 5069, 80), ("city", 5149, 233),
)
HOLDOUT = 0.10
SPLIT_RULE = (
    "train = valid.libsvm minus a held-out 10 % (the round(0.1*N) lines with the smallest splitmix64 hash "
    "of the line number), valid = that held-out slice, test = test.libsvm; no timestamps, ts = line number"
)


def read_libsvm(path: Path, limit: int | None, bad: BadRows | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(labels [N], raw one-hot indices [N, 10]) with every index checked against its field range."""
    names = ["label"] + [f for f, _, _ in FIELDS]
    table = read_csv(
        path, bad or BadRows(), "not Frappe libsvm (label and 10 index:1 fields)",
        read_options=pcsv.ReadOptions(column_names=names),
        parse_options=pcsv.ParseOptions(delimiter=" "),
        convert_options=pcsv.ConvertOptions(column_types={n: pa.string() for n in names[1:]}),
    )
    if limit is not None:
        table = table.slice(0, limit)
    labels = table["label"].to_numpy()
    if not np.isin(labels, (0, 1)).all():
        row = int(np.flatnonzero(~np.isin(labels, (0, 1)))[0])
        raise AdapterError(f"{path}: line {row + 1}: label {labels[row]} is not 0/1")
    idx = np.empty((table.num_rows, len(FIELDS)), np.int64)
    for k, (name, start, count) in enumerate(FIELDS):
        col = np.array(table[name].to_pylist(), dtype=object)
        parts = np.char.partition(col.astype(str), ":")
        bad = parts[:, 2] != "1"
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise AdapterError(f"{path}: line {row + 1}: feature {k + 1} {col[row]!r} is not 'index:1'")
        idx[:, k] = parts[:, 0].astype(np.int64)
        out = (idx[:, k] < start) | (idx[:, k] >= start + count)
        if out.any():
            row = int(np.flatnonzero(out)[0])
            raise AdapterError(f"{path}: line {row + 1}: index {idx[row, k]} outside field {name!r} "
                               f"range {start}..{start + count - 1}")
        idx[:, k] -= start
    return labels.astype(np.float32), idx


def convert(src: str | Path, out: str | Path, limit: int | None = None,
            force: bool = False) -> dict[str, Any]:
    src = Path(src)
    require_files(src, ["valid.libsvm", "test.libsvm"])
    bad = BadRows()
    y_pool, x_pool = read_libsvm(src / "valid.libsvm", limit, bad)
    y_test, x_test = read_libsvm(src / "test.libsvm", limit, bad)
    n_pool = len(y_pool)
    n_hold = int(round(HOLDOUT * n_pool))
    held = np.zeros(n_pool, bool)
    held[np.argsort(splitmix64(np.arange(n_pool)), kind="stable")[:n_hold]] = True
    split = np.concatenate([np.where(held, 1, 0), np.full(len(y_test), 2)])
    train = split == 0
    x = np.concatenate([x_pool, x_test])
    n = len(split)

    cols: dict[str, Any] = {
        "example_id": np.arange(n, dtype=np.int64), "ts": np.arange(n, dtype=np.int64),
        "surface": np.zeros(n, np.int32), "click": np.concatenate([y_pool, y_test]),
    }
    vocabs: dict[str, int] = {}
    for k, (name, _, _) in enumerate(FIELDS):
        cols[name], vocabs[name] = encode_on_train(pa.array(x[:, k]), train)

    schema = FeatureSchema.from_dict({
        "name": "frappe_x1", "surfaces": ["all"],
        "sparse": sparse_specs(vocabs), "task": [{"name": "click"}],
    }, source="frappe_x1 adapter")
    tables = {name: make_table(schema, take_columns(cols, np.flatnonzero(split == i)), f"frappe_x1/{name}")
              for i, name in enumerate(("train", "valid", "test"))}
    return write_dataset(out, schema, tables, SPLIT_RULE, extra={"source": str(src), "limit": limit},
                         force=force, bad=bad)
