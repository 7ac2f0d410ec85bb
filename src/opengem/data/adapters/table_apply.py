"""``opengem convert table --encoders DATASET``: new rows of a log through a converted dataset's encoders.

A model trained on a converted dataset reads ids from *that* dataset's vocabularies. Converting the next
day's file on its own would fit new vocabularies (the same id would then name another value) and new dense
statistics, and the run's model would score it without a word of warning. This mode fits nothing: it reads
DATASET's encoders (``encoders.json`` + ``_encoders/``, digests checked) and its ``schema.toml``, encodes
every source row with them (a value the vocabularies do not hold takes the out-of-vocabulary row 0, as an
unseen value does in DATASET's own valid and test rows), and writes all rows, in source order, into one
split (``--split-name``, default ``test``) of a dataset whose schema and encoders are DATASET's. So
``opengem predict`` / ``evaluate --data OUT`` and online training read it with the run's model, and a
server built from either dataset encodes raw values the same way. A label column the new rows lack is
written unobserved (rows to score, not to learn from); a surface DATASET does not know is an error naming
the file and row.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
from tqdm import tqdm

from opengem.data.adapters.common import AdapterError, BadRows
from opengem.data.adapters.encoders_io import ENCODERS_FILE, encoders_from_dict, read_encoders, write_encoders
from opengem.data.adapters.sources import Source, expand
from opengem.data.adapters.table import (
    TableJob,
    build_summary,
    check_columns,
    set_text_types,
    source_format,
    stream,
    write,
)
from opengem.data.adapters.table_encode import Encoders, fit_encoders
from opengem.data.adapters.table_split import SPLITS, SplitRule
from opengem.data.commit import staged_dir
from opengem.data.schema import FeatureSchema
from opengem.errors import UsageError

# what the encoders already decide: giving any of these with --encoders is a usage error
FITTING_OPTIONS = (("schema", "--schema"), ("infer_schema", "--infer-schema"), ("label", "--label"),
                   ("time", "--time"), ("surface", "--surface"), ("split", "--split"),
                   ("time_cuts", "--time-cuts"), ("exact_holdout", "--exact-holdout"),
                   ("min_count", "--min-count"), ("hash_buckets", "--hash-buckets"), ("table_name", "--name"))


@dataclasses.dataclass
class ApplyJob:
    """A conversion through fitted encoders: the streaming job, the encoders and schema it writes with."""

    job: TableJob
    encoders: Encoders
    schema: FeatureSchema
    text_columns: list[str]
    dataset: Path


def apply_job_from_args(args: argparse.Namespace) -> ApplyJob:
    given = [flag for key, flag in FITTING_OPTIONS if getattr(args, key, None) not in (None, False)]
    if given:
        them = "it" if len(given) == 1 else "them"
        raise UsageError(f"convert table --encoders: {', '.join(given)} would fit or override what the "
                         f"encoders of {args.encoders} already fix; leave {them} out")
    dataset = Path(args.encoders)
    record = read_encoders(dataset)
    if record is None or not (dataset / "schema.toml").is_file():
        raise UsageError(f"--encoders {dataset}: no {ENCODERS_FILE} and schema.toml there; give a dataset "
                         "written by `opengem convert table`")
    enc = encoders_from_dict(record, str(dataset / ENCODERS_FILE))
    schema = FeatureSchema.load(dataset / "schema.toml")
    srcs = args.src or []
    if not srcs:
        raise UsageError("convert table --encoders: --src is required (the new rows: a file or a glob)")
    if any(s.split("=", 1)[0] in SPLITS and "=" in s for s in srcs):
        raise UsageError("convert table --encoders: every row goes into --split-name; give --src PATH, "
                         "not SPLIT=PATH")
    fmt = source_format(args)
    columns = [c.strip() for c in args.columns.split(",")] if args.columns else None
    source = Source([f for s in srcs for f in expand(s)], fmt, columns)
    have = set(source.schema().names)
    missing_labels = tuple(dict.fromkeys(r.column for r in enc.spec.label_rules if r.column not in have))

    def unobserved(batch: pa.RecordBatch, path: Path) -> pa.RecordBatch:
        for col in missing_labels:
            batch = batch.append_column(col, pa.nulls(batch.num_rows, pa.float64()))
        return batch

    split = args.split_name or "test"
    job = TableJob({split: source}, enc.spec, SplitRule("files"), shuffle=False,
                   derive=unobserved if missing_labels else None, derived=missing_labels,
                   rule_text=f"every row into {split}, in source order, through the encoders of {dataset}",
                   writer="opengem convert table --encoders")
    return ApplyJob(job, enc, schema, list(record.get("text_columns", [])), dataset)


def apply_encoders(a: ApplyJob, out: str | Path, force: bool = False) -> dict[str, Any]:
    """Encode and write (pass 1 only counts rows and labels per split); returns summary.json's record."""
    job, spec = a.job, a.job.spec
    set_text_types(job)
    check_columns(job)
    bad = BadRows()
    columns = [c for c, _ in spec.source_columns() if c not in job.derived]
    with tqdm(desc="convert table --encoders: pass 1/2 (count)", unit=" rows", disable=None) as bar:
        counted, counts = fit_encoders(spec, stream(job, bad, columns, bar), fit=False)
    if not sum(counted.split_rows):
        files = [str(f) for s in job.sources.values() for f in s.files]
        raise AdapterError(f"{', '.join(files)}: no rows")
    enc = dataclasses.replace(a.encoders, split_rows=counted.split_rows)
    with staged_dir(out, writer=f"{job.writer} {a.schema.name}", force=force) as st:
        oov = write(job, enc, a.schema, st.path)
        summary = build_summary(job, enc, a.schema, counts, oov, bad)
        summary["encoders_from"] = str(a.dataset)
        summary["unobserved_labels"] = list(job.derived)
        a.schema.save(st.path / "schema.toml")
        write_encoders(a.encoders, st.path, a.text_columns)
        (st.path / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        st.record["bad_rows"] = bad.total
    return summary
