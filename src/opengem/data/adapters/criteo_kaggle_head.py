"""Criteo Kaggle DAC -> canonical Parquet: the shared 8,000-row head, or the full public release.

Two layouts of ``--src``:

- the head (a folder with train.tsv, dev.tsv, test.tsv: the first 8,000 rows of train.txt, already split
  7,200 / 409 / 391 by the source repo): train.tsv -> train, dev.tsv -> valid, test.tsv -> test;
- the full release (Kaggle ``dac.tar.gz`` extracted: a folder holding ``train.txt``, or that file itself,
  45,840,617 rows, about 11 GB; its ``test.txt`` has no labels and is not read): a random 80/10/10 split
  by the importer's seeded splitmix64 hash of the line number (seed 0), the usual protocol for this
  release (rows are chronological but carry no timestamp). Dataset name ``criteo_kaggle``.

Both are tab-separated without a header: label, I1..I13, C1..C26, empty = missing. ``ts`` = row number
(over train, dev, test in that order for the head). One surface ``all``; task ``click``.

I1..I13 become dense ``log1p(max(x, 0))`` (I2 has small negatives) with missing -> 0 plus a 0/1
``I<k>_missing`` dense indicator, so "missing" and "zero" stay distinguishable. C1..C26 are sparse,
indexed on the training rows: id 0 is the out-of-vocabulary row shared by empty values, values seen
fewer than ``min_count`` times in train and unseen values, so it is trained (see ``vocab``); a column
with more than ``hash_buckets`` kept values (most of the full release's) is hashed.

Both go through the generic importer's streaming path (``table``): a few 8 MB blocks, the vocabularies
and one shuffle bucket in memory, whatever the file size; train rows are shuffled within their split.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opengem.data.adapters.common import AdapterError
from opengem.data.adapters.infer import DEFAULT_MIN_COUNT, DenseSpec, ImportSpec, SparseSpec
from opengem.data.adapters.sources import Source
from opengem.data.adapters.table import TableJob, convert_table
from opengem.data.adapters.table_split import SplitRule

FILES = (("train", "train.tsv"), ("valid", "dev.tsv"), ("test", "test.tsv"))
RELEASE = "train.txt"
INTS = [f"I{i}" for i in range(1, 14)]
CATS = [f"C{i}" for i in range(1, 27)]
COLUMNS = ["click", *INTS, *CATS]
SPLIT_RULE = ("train = train.tsv, valid = dev.tsv, test = test.tsv (source repo's random split); "
              "ts = row number")
RELEASE_SPLIT = SplitRule("random", valid_frac=0.1, test_frac=0.1, seed=0)


def spec(min_count: int = DEFAULT_MIN_COUNT, name: str = "criteo_kaggle_head") -> ImportSpec:
    return ImportSpec(name=name, labels=["click"], min_count=min_count,
                      sparse=[SparseSpec(c) for c in CATS],
                      dense=[DenseSpec(c, transform="log1p") for c in INTS])


def job_for(src: Path, limit: int | None = None) -> TableJob:
    """The conversion of either layout (see the module docstring); neither is an AdapterError."""
    extra = {"source": str(src), "limit": limit}
    head = src.is_dir() and all((src / f).is_file() for _, f in FILES)
    release = src / RELEASE if src.is_dir() else src
    if head:
        sources = {split: Source([src / f], "tsv", COLUMNS, limit=limit) for split, f in FILES}
        return TableJob(sources, spec(), SplitRule("files"), rule_text=SPLIT_RULE, writer="opengem convert",
                        extra=extra)
    if release.is_file():
        rule = SplitRule(RELEASE_SPLIT.mode, RELEASE_SPLIT.valid_frac, RELEASE_SPLIT.test_frac,
                         RELEASE_SPLIT.seed)
        return TableJob({"": Source([release], "tsv", COLUMNS, limit=limit)}, spec(name="criteo_kaggle"),
                        rule, rule_text=f"full release {release.name}: {rule.describe()}; ts = row number",
                        writer="opengem convert", extra=extra)
    missing = ", ".join(f for _, f in FILES if not (src / f).is_file())
    raise AdapterError(f"{src}: missing source file(s) {missing} (the 8,000-row head) and no {RELEASE} "
                       "(the full Kaggle release, or give that file as --src)")


def convert(src: str | Path, out: str | Path, limit: int | None = None,
            force: bool = False) -> dict[str, Any]:
    return convert_table(job_for(Path(src), limit), out, force=force)
