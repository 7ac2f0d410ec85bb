"""Criteo Kaggle DAC, first 8,000 rows of train.txt (already split 7,200 / 409 / 391) -> canonical Parquet.

Split: train.tsv -> train, dev.tsv -> valid, test.tsv -> test (the source repo's random split of
the first 8,000 rows; no timestamps, so ``ts`` = row number over train, dev, test in that order).
One surface ``all``; task ``click``.

I1..I13 become dense ``log1p(max(x, 0))`` (I2 has small negatives) with missing -> 0 plus a 0/1
``I<k>_missing`` dense indicator, so "missing" and "zero" stay distinguishable. C1..C26 are sparse,
re-indexed on the training file (0 = empty or unseen).
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
    log1p_dense,
    make_table,
    read_csv,
    require_files,
    sparse_specs,
    take_columns,
    write_dataset,
)
from opengem.data.schema import FeatureSchema

FILES = (("train", "train.tsv"), ("valid", "dev.tsv"), ("test", "test.tsv"))
INTS = [f"I{i}" for i in range(1, 14)]
CATS = [f"C{i}" for i in range(1, 27)]
SPLIT_RULE = ("train = train.tsv, valid = dev.tsv, test = test.tsv (source repo's random split); "
              "ts = row number")


def read_split(path: Path, limit: int | None, bad: BadRows | None = None) -> pa.Table:
    names = ["label", *INTS, *CATS]
    types = {"label": pa.int64(), **{c: pa.float64() for c in INTS}, **{c: pa.string() for c in CATS}}
    table = read_csv(
        path, bad or BadRows(), "not Criteo TSV (label, I1..I13, C1..C26)",
        read_options=pcsv.ReadOptions(column_names=names),
        parse_options=pcsv.ParseOptions(delimiter="\t"),
        convert_options=pcsv.ConvertOptions(column_types=types, strings_can_be_null=True),
    )
    if limit is not None:
        table = table.slice(0, limit)
    labels = table["label"].to_numpy(zero_copy_only=False)
    if table["label"].null_count or not np.isin(labels, (0, 1)).all():
        raise AdapterError(f"{path}: column 'label' must be 0/1 everywhere")
    return table


def convert(src: str | Path, out: str | Path, limit: int | None = None,
            force: bool = False) -> dict[str, Any]:
    src = Path(src)
    require_files(src, [f for _, f in FILES])
    bad = BadRows()
    parts = [read_split(src / f, limit, bad) for _, f in FILES]
    split = np.concatenate([np.full(p.num_rows, i) for i, p in enumerate(parts)])
    table = pa.concat_tables(parts)
    train = split == 0
    n = table.num_rows
    cols: dict[str, Any] = {
        "example_id": np.arange(n, dtype=np.int64), "ts": np.arange(n, dtype=np.int64),
        "surface": np.zeros(n, np.int32), "click": table["label"].to_numpy().astype(np.float32),
    }
    vocabs: dict[str, int] = {}
    for c in CATS:
        cols[c], vocabs[c] = encode_on_train(table[c], train)
    dense = []
    for c in INTS:
        cols[c], cols[f"{c}_missing"] = log1p_dense(table[c])
        dense += [c, f"{c}_missing"]
    schema = FeatureSchema.from_dict({
        "name": "criteo_kaggle_head", "surfaces": ["all"],
        "sparse": sparse_specs(vocabs), "dense": [{"name": d} for d in dense],
        "task": [{"name": "click"}],
    }, source="criteo_kaggle_head adapter")
    tables = {name: make_table(schema, take_columns(cols, np.flatnonzero(split == i)), f"criteo/{name}")
              for i, (name, _) in enumerate(FILES)}
    return write_dataset(out, schema, tables, SPLIT_RULE, extra={"source": str(src), "limit": limit},
                         force=force, bad=bad)
