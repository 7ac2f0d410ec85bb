"""Criteo Kaggle DAC, first 8,000 rows of train.txt (already split 7,200 / 409 / 391) -> canonical Parquet.

Split: train.tsv -> train, dev.tsv -> valid, test.tsv -> test (the source repo's random split of
the first 8,000 rows; no timestamps, so ``ts`` = row number over train, dev, test in that order).
One surface ``all``; task ``click``.

I1..I13 become dense ``log1p(max(x, 0))`` (I2 has small negatives) with missing -> 0 plus a 0/1
``I<k>_missing`` dense indicator, so "missing" and "zero" stay distinguishable. C1..C26 are sparse,
indexed on the training file: id 0 is the out-of-vocabulary row shared by empty values, values seen
fewer than ``min_count`` times in train and unseen values, so it is trained (see ``vocab``).

Converted through the generic importer's streaming path (``table``): bounded memory, so the same
code converts the full public release (``--src`` a folder holding train.tsv, dev.tsv, test.tsv);
train rows are shuffled within their split (seeded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opengem.data.adapters.common import require_files
from opengem.data.adapters.infer import DEFAULT_MIN_COUNT, DenseSpec, ImportSpec, SparseSpec
from opengem.data.adapters.sources import Source
from opengem.data.adapters.table import TableJob, convert_table
from opengem.data.adapters.table_split import SplitRule

FILES = (("train", "train.tsv"), ("valid", "dev.tsv"), ("test", "test.tsv"))
INTS = [f"I{i}" for i in range(1, 14)]
CATS = [f"C{i}" for i in range(1, 27)]
SPLIT_RULE = ("train = train.tsv, valid = dev.tsv, test = test.tsv (source repo's random split); "
              "ts = row number")


def spec(min_count: int = DEFAULT_MIN_COUNT) -> ImportSpec:
    return ImportSpec(name="criteo_kaggle_head", labels=["click"], min_count=min_count,
                      sparse=[SparseSpec(c) for c in CATS],
                      dense=[DenseSpec(c, transform="log1p") for c in INTS])


def convert(src: str | Path, out: str | Path, limit: int | None = None,
            force: bool = False) -> dict[str, Any]:
    src = Path(src)
    require_files(src, [f for _, f in FILES])
    columns = ["click", *INTS, *CATS]
    sources = {split: Source([src / f], "tsv", columns, limit=limit) for split, f in FILES}
    job = TableJob(sources, spec(), SplitRule("files"), rule_text=SPLIT_RULE, writer="opengem convert",
                   extra={"source": str(src), "limit": limit})
    return convert_table(job, out, force=force)
