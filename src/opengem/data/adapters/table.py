"""``opengem convert table``: one's own click log (CSV, TSV, Parquet, libsvm) -> canonical Parquet.

Streaming, in bounded memory (a few source blocks, the vocabularies, and one shuffle bucket at a time):

- pass 0 (``--split time`` only): the time column, for the split's quantile cuts;
- pass 1: every row's split (:mod:`table_split`); on the train rows, value counts of each categorical
  feature and mean/std of each dense one (:mod:`vocab`); rows and label sums per split;
- pass 2: encode every row and write ``valid``/``test`` in source order; train rows go to seeded random
  shuffle buckets (hidden files in the staging folder), each then permuted and appended to ``train``.
  Rows are thus shuffled within the train split, never across splits (``--no-shuffle`` keeps order).

Ids: 0 is each feature's out-of-vocabulary row, shared by missing, rare (< ``min_count`` in train) and
unseen values, so it is trained (see :mod:`vocab`). ``example_id`` and ``ts`` are generated from the
source row number (counted over the files in order, after skipped malformed rows) when the spec names
no such column; one surface ``all`` unless ``--surface COL``. The output is committed through
``commit.staged_dir`` with schema.toml, summary.json (split rule, rows, label rates, OOV shares) and the
fitted encoders (``encoders.json`` + ``_encoders/``, :mod:`encoders_io`) that serving applies to raw values.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

from opengem.data.adapters.common import AdapterError, BadRows, sparse_specs
from opengem.data.adapters.encoders_io import write_encoders
from opengem.data.adapters.infer import (
    DEFAULT_HASH_BUCKETS,
    DEFAULT_MIN_COUNT,
    ImportSpec,
    check_spec,
    infer_spec,
    load_spec,
    mostly_numbers,
)
from opengem.data.adapters.labels import LabelSyntaxError, parse_labels
from opengem.data.adapters.sources import Source, expand, format_from_names
from opengem.data.adapters.table_encode import Chunk, Encoders, RowPlace, fit_encoders, prepare_lists
from opengem.data.adapters.table_split import SPLITS, TRAIN, SplitRule, time_cuts
from opengem.data.commit import staged_dir
from opengem.data.parquet import CanonicalWriter
from opengem.data.schema import FeatureSchema
from opengem.errors import UsageError

# Train rows are dealt to shuffle buckets of about this many rows (each read back whole), at most
# MAX_BUCKETS of them open at once, each flushing every BUCKET_GROUP rows: memory stays bounded whatever
# the file size (a 45M-row log: 64 buckets of ~560k rows).
SHUFFLE_BUCKET_ROWS = 500_000
MAX_BUCKETS = 64
BUCKET_GROUP = 8192
ROW_GROUP_ROWS = 65_536  # row groups of the output files (the loader's unit), each buffered until full
RESERVED = ("example_id", "ts", "surface")


@dataclass
class TableJob:
    """Everything one conversion needs, resolved from the command line."""

    sources: dict[str, Source]  # split name -> source; one key "" for a single source
    spec: ImportSpec
    rule: SplitRule
    shuffle: bool = True
    spec_path: str = ""
    # adapters: columns computed from each source batch (e.g. Avazu's ts from its hour column), their
    # names, a split rule in the dataset's own words, and extra summary entries
    derive: Callable[[pa.RecordBatch, Path], pa.RecordBatch] | None = None
    derived: tuple[str, ...] = ()
    rule_text: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    writer: str = "opengem convert table"
    notes: list[str] = field(default_factory=list)  # what inference wants the user to look at (printed)

    @property
    def split_of_source(self) -> dict[str, int | None]:
        return {k: (None if k == "" else SPLITS.index(k)) for k in self.sources}


# --------------------------------------------------------------------------- streaming rows
def _int_column(batch: pa.RecordBatch, name: str, place: RowPlace, role: str) -> np.ndarray:
    col = batch.column(name)
    if pa.types.is_string(col.type) and col.null_count < len(col):
        try:
            col = pc.cast(col, pa.int64())
        except pa.ArrowInvalid:  # not integers: maybe ISO date-times
            try:
                col = pc.cast(col, pa.timestamp("s"))
            except pa.ArrowInvalid:
                pass  # reported below
    if pa.types.is_timestamp(col.type) or pa.types.is_date(col.type):
        col = pc.cast(pc.cast(col, pa.timestamp("s")), pa.int64())
    if col.null_count:
        j = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise AdapterError(f"{place(j)}, column {name!r} ({role}): empty value")
    try:
        return pc.cast(col, pa.int64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        bad = _first_not_a_time(col)
        if bad is None:
            raise AdapterError(f"{place.file}: column {name!r} ({role}) must be integers or timestamps: "
                               f"{e}") from None
        j, kind = bad
        raise AdapterError(f"{place(j)}, column {name!r} ({role}): {col[j].as_py()!r} is not {kind} (the "
                           "column's first value is)") from None


def _first_not_a_time(col: pa.Array) -> tuple[int, str] | None:
    """The row of the first cell that does not read as the column's first value does (an integer or an ISO
    date-time), and what it should be: a bad cell is then named by its line, not by Arrow's message about
    some other value. Only called once the whole column failed to convert: no cost on good data."""
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        return None

    def as_int(v: str) -> bool:
        try:
            int(v)
            return True
        except ValueError:
            return False

    def as_time(v: str) -> bool:
        try:
            pa.scalar(v).cast(pa.timestamp("s"))
            return True
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return False

    values = col.to_pylist()
    first = next((v for v in values if v is not None), None)
    if first is None:
        return None
    ok, kind = ((as_int, "an integer") if as_int(first)
                else (as_time, "a date-time such as 2023-11-14 22:13:20"))
    j = next((j for j, v in enumerate(values) if v is not None and not ok(v)), None)
    return None if j is None else (j, kind)


def stream(job: TableJob, bad: BadRows, columns: list[str] | None = None,
           progress: tqdm | None = None) -> Iterator[Chunk]:
    """Every source row once, in order, with its split (needs ``job.rule.cuts`` in time mode)."""
    spec = job.spec
    need = None if columns is None or job.derive else sorted(
        {*columns, *(c for c in (spec.time, spec.example_id) if c)})
    row0 = 0
    for key, source in job.sources.items():
        file_split = job.split_of_source[key]
        unit = "row" if source.fmt == "parquet" else "line"
        place: RowPlace | None = None  # of the chunk's first row; files are read one after another
        for path, batch in source.batches(bad, need):
            if place is None or place.file != path:
                place = RowPlace(path, 0, unit, source.header_lines(path), bad)
            if job.derive is not None:
                batch = job.derive(batch, path)
            batch = prepare_lists(batch, spec, path)
            n = batch.num_rows
            rows = np.arange(row0, row0 + n, dtype=np.int64)
            ts = _int_column(batch, spec.time, place, "time") if spec.time else rows
            eid = _int_column(batch, spec.example_id, place, "example_id") if spec.example_id else rows
            split = job.rule.assign(rows, ts, file_split) if job.rule.cuts or job.rule.mode != "time" \
                else np.zeros(n, np.int8)
            yield Chunk(path, batch, rows, ts, eid, split, place)
            row0 += n
            place = replace(place, first=place.first + n)
            if progress is not None:
                progress.update(n)


def check_columns(job: TableJob) -> None:
    """Every column the spec needs, missing from any source, listed at once with whose it is."""
    problems = []
    for key, source in job.sources.items():
        names = set(source.schema().names) | set(job.derived)
        missing = [f"{c} ({role})" for c, role in job.spec.source_columns() if c not in names]
        if missing:
            problems.append(f"{source.files[0]}{f' [{key}]' if key else ''}: missing your column(s) "
                            f"{', '.join(missing)}")
    clash = [s.name for s in [*job.spec.sparse, *job.spec.dense, *job.spec.sequence] if s.name in RESERVED]
    clash += [t for t in job.spec.task_names if t in RESERVED]
    if clash:
        problems.append(f"feature name(s) {', '.join(clash)} are the contract's bookkeeping columns")
    if problems:
        raise AdapterError("; ".join(problems) + f" (spec: {job.spec_path or 'inferred'}; the contract's "
                           "example_id and ts are generated from the row number when absent, surface "
                           "is 'all' without --surface)")


# --------------------------------------------------------------------------- the passes
def fit(job: TableJob, bad: BadRows) -> tuple[Encoders, dict[str, Any]]:
    """Pass 0 (time cuts) and pass 1 (vocabularies, dense statistics, per-split rows and labels)."""
    spec = job.spec
    if job.rule.mode == "time" and job.rule.cuts is None:
        if not spec.time:
            raise UsageError("--split time needs a time column: pass --time COL")
        ts = np.concatenate([c.ts for c in stream(job, BadRows(), [spec.time])] or [np.zeros(0, np.int64)])
        job.rule.cuts = time_cuts(ts, job.rule.valid_frac, job.rule.test_frac)
        del ts
    if job.rule.exact and job.rule.exact_rows is None:
        job.rule.set_exact_cuts(*_hashed_source_rows(job))
    columns = [c for c, _ in spec.source_columns()]
    with tqdm(desc="convert table: pass 1/2 (vocabularies)", unit=" rows", disable=None) as bar:
        encoders, counts = fit_encoders(spec, stream(job, bad, columns, bar))
    return encoders, counts


def _hashed_source_rows(job: TableJob) -> tuple[int, int]:
    """(first row, rows) of the source the exact holdout draws from (the train source under --split
    files, else the one source), counted as ``stream`` numbers rows: one read of a single column."""
    first = 0
    one = [job.spec.label_rules[0].column]
    for key, source in job.sources.items():
        n = sum(b.num_rows for _, b in source.batches(BadRows(), one))
        if key in ("", "train"):
            return first, n
        first += n
    raise AdapterError("--exact-holdout: no train source to hold rows out of")


def output_schema(job: TableJob, enc: Encoders) -> FeatureSchema:
    spec = job.spec
    vocabs = {s.name: enc.vocabs[s.name].size for s in spec.sparse}
    sparse = sparse_specs(vocabs, dims={s.name: s.dim for s in spec.sparse if s.dim},
                          multi=[s.name for s in spec.sparse if s.multi_valued])
    dense = []
    for d in spec.dense:
        dense.append({"name": d.name})
        if d.missing_indicator:
            dense.append({"name": f"{d.name}_missing"})
    seqs: dict[str, dict] = {}
    tables = {d["name"]: d for d in sparse}
    for q in sorted(spec.sequence, key=lambda q: bool(q.group)):  # each group's first field first
        size = enc.vocabs[q.name].size
        dim = q.dim or (4 if size <= 16 else 8 if size <= 256 else 16)
        # a history of an item's ids reads that item's table (the same rows, as the named adapters share
        # them); otherwise the table is named after its column: two histories, or a history beside a feature
        # called "id", must not share (or clash on) one table "id"
        table = q.output_column()
        if q.share:
            table, dim = tables[q.share].get("table", q.share), tables[q.share]["dim"]
        f = {"name": q.name if q.group else "id", "vocab": size, "dim": dim, "table": table}
        if q.group:  # one more attribute of the group's events
            seqs[q.group]["fields"].append(f)
        else:
            seqs[q.name] = {"name": q.name, "max_len": q.max_len, "on_overflow": "truncate", "fields": [f]}
    matches = [{"sequence": q.group or q.name, "field": q.name if q.group else "id", "feature": q.share,
                "recent": q.match_recent} for q in spec.sequence if q.share and q.match_recent]
    return FeatureSchema.from_dict({
        "name": spec.name, "surfaces": enc.surfaces, "sparse": sparse, "dense": dense,
        "sequence": list(seqs.values()),
        "task": [{"name": c} for c in spec.task_names], **({"match_features": matches} if matches else {}),
    }, source=f"convert table {spec.name}")


def write(job: TableJob, enc: Encoders, schema: FeatureSchema, out: Path) -> dict[str, int]:
    """Pass 2 into ``out``'s staging folder; returns OOV row counts per 'split/feature'."""
    rng = np.random.default_rng(job.rule.seed)
    n_train = enc.split_rows[TRAIN]
    n_buckets = min(MAX_BUCKETS, max(1, -(-n_train // SHUFFLE_BUCKET_ROWS))) if job.shuffle else 1
    shuffle_dir = out / ".shuffle"
    writers = {s: CanonicalWriter(schema, out / s / "part-00000.parquet", ROW_GROUP_ROWS) for s in SPLITS}
    buckets = ([CanonicalWriter(schema, shuffle_dir / f"bucket-{b:05d}.parquet", BUCKET_GROUP)
                for b in range(n_buckets)] if job.shuffle else [])
    oov: dict[str, int] = {}
    columns = [c for c, _ in job.spec.source_columns()]
    try:
        with tqdm(total=sum(enc.split_rows), desc="convert table: pass 2/2 (write)", unit=" rows",
                  disable=None) as bar:
            for chunk in stream(job, BadRows(), columns, bar):
                table = enc.encode(chunk, schema)
                for code, name in enumerate(SPLITS):
                    mask = chunk.split == code
                    if not mask.any():
                        continue
                    part = table.filter(pa.array(mask))
                    for f in schema.sparse:
                        if not f.multi_valued:
                            key = f"{name}/{f.name}"
                            oov[key] = oov.get(key, 0) + int(pc.sum(pc.equal(part[f.name], 0)).as_py() or 0)
                    if code == TRAIN and job.shuffle:
                        which = rng.integers(0, n_buckets, part.num_rows)
                        for b in np.unique(which):
                            buckets[b].write(part.filter(pa.array(which == b)))
                    else:
                        writers[name].write(part)
        for b in buckets:
            b.close()
            piece = pq.read_table(b.path)
            writers["train"].write(piece.take(pa.array(rng.permutation(piece.num_rows))))
            b.path.unlink()
        for w in writers.values():
            w.close()
    except BaseException:
        for w in [*writers.values(), *buckets]:
            w.abort()
        raise
    finally:
        shutil.rmtree(shuffle_dir, ignore_errors=True)
    return oov


def set_text_types(job: TableJob) -> None:
    """CSV/TSV sources read ids as strings (robust to mixed blocks) and labels and dense values as float64."""
    for src in job.sources.values():
        if src.fmt in ("csv", "tsv"):
            names = set(src.schema().names)
            src.types = {**{c: pa.string() for c in names},
                         **{r.column: pa.float64() for r in job.spec.label_rules if r.column in names},
                         **{d.name: pa.float64() for d in job.spec.dense if d.name in names}}


def convert_table(job: TableJob, out: str | Path, force: bool = False) -> dict[str, Any]:
    """Run the conversion; returns the summary written to summary.json."""
    set_text_types(job)
    check_columns(job)
    bad = BadRows()
    enc, counts = fit(job, bad)
    if sum(enc.split_rows) == 0:
        files = [str(f) for src in job.sources.values() for f in src.files]
        skipped = f" ({bad.total} skipped as malformed)" if bad.total else ""
        raise AdapterError(f"{', '.join(files[:3])}{' ...' if len(files) > 3 else ''}: no data rows"
                           f"{skipped}: nothing to convert (a header only?)")
    if enc.split_rows[TRAIN] == 0:
        raise AdapterError(f"{job.spec.name}: the train split is empty ({job.rule.describe()})")
    schema = output_schema(job, enc)
    with staged_dir(out, writer=f"{job.writer} {schema.name}", force=force) as st:
        oov = write(job, enc, schema, st.path)
        summary = build_summary(job, enc, schema, counts, oov, bad)
        schema.save(st.path / "schema.toml")
        write_encoders(enc, st.path, _text_columns(job))  # raw values can be served (docs/SERVING.md)
        (st.path / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        st.record["bad_rows"] = bad.total
    return summary


def _text_columns(job: TableJob) -> list[str]:
    """Categorical columns every source holds as text (CSV/TSV are read as strings): a hashed one hashes
    the text, so a server given a raw number for it must hash that number's text too."""
    out = []
    shared = {q.name: q.share for q in job.spec.sequence if q.share}  # read as their item's type
    spread = {q.name: q.columns[0] for q in job.spec.sequence if q.columns}  # its cells' type: its columns'
    for name in [s.name for s in [*job.spec.sparse, *job.spec.sequence]]:
        if name in shared:
            if shared[name] in out:
                out.append(name)
            continue
        text = True
        for src in job.sources.values():
            if src.fmt in ("csv", "tsv"):
                continue
            schema = src.schema() if src.fmt == "parquet" else None
            col = spread.get(name, name)
            t = schema.field(col).type if schema is not None and col in schema.names else None
            if t is not None and (pa.types.is_list(t) or pa.types.is_large_list(t)):
                t = t.value_type
            text = text and t is not None and (pa.types.is_string(t) or pa.types.is_large_string(t))
        if text:
            out.append(name)
    return out


def build_summary(job: TableJob, enc: Encoders, schema: FeatureSchema, counts: dict[str, Any],
                  oov: dict[str, int], bad: BadRows) -> dict[str, Any]:
    splits = {}
    for code, name in enumerate(SPLITS):
        rows = enc.split_rows[code]
        splits[name] = {
            "rows": rows,
            "label_rates": {t: (round(counts["label_sum"][t][code] / counts["label_n"][t][code], 6)
                                if counts["label_n"][t][code] else None) for t in job.spec.task_names},
            "ts_min": counts["ts_min"][code], "ts_max": counts["ts_max"][code],
            "oov_share": {f.name: round(oov.get(f"{name}/{f.name}", 0) / rows, 6) if rows else None
                          for f in schema.sparse if not f.multi_valued},
        }
    return {
        "dataset": schema.name,
        "partitions": list(SPLITS),
        "split_rule": job.rule_text or job.rule.describe(),
        "shuffled": f"train rows shuffled (seed {job.rule.seed})" if job.shuffle else "source order",
        "rows": sum(enc.split_rows),
        "splits": splits,
        "vocab": {f.name: f.vocab for f in schema.sparse},
        "hashed": sorted(k for k, v in enc.vocabs.items() if v.hashed),
        "oov_rule": f"id 0 = missing, seen < {job.spec.min_count} times in train, or unseen in train",
        "dense_stats": enc.dense_summary(),
        "generated": [c for c, g in (("example_id", not job.spec.example_id), ("ts", not job.spec.time))
                      if g],
        "sources": {k or "all": [str(f) for f in s.files] for k, s in job.sources.items()},
        "import_spec": asdict(job.spec),
        "bad_rows": bad.report(),
        **job.extra,
    }


# --------------------------------------------------------------------------- command line
def _sources(args: argparse.Namespace, columns: list[str] | None) -> tuple[dict[str, Source], str]:
    srcs = args.src or []
    if not srcs:
        raise UsageError("convert table: --src is required (a file or a glob; SPLIT=PATH for --split files)")
    named = [s.split("=", 1) for s in srcs if "=" in s and s.split("=", 1)[0] in SPLITS]
    if named and len(named) != len(srcs):
        raise UsageError("convert table: either every --src is SPLIT=PATH or none is")
    if named:
        if args.split not in (None, "files"):
            raise UsageError(f"convert table: --src SPLIT=PATH means --split files, not --split {args.split}")
        if "train" not in dict(named):
            raise UsageError("convert table: --split files needs --src train=PATH")
        order = sorted(named, key=lambda kv: SPLITS.index(kv[0]))
        first = expand(order[0][1])[0]  # later files without a header take the train file's names
        return {k: Source(expand(v), args.format, columns, header_file=first) for k, v in order}, "files"
    files = [f for s in srcs for f in expand(s)]
    if args.split == "files":
        raise UsageError("convert table: --split files needs --src train=PATH [--src valid=PATH] ...")
    return {"": Source(files, args.format, columns)}, args.split or ""


def _time_cuts(text: str | None, mode: str, time: str) -> tuple[int, int] | None:
    if not text:
        return None
    if mode != "time" or not time:
        raise UsageError("--time-cuts needs --split time and a time column (--time COL)")
    try:
        a, b = (int(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"--time-cuts {text}: expected two integers VALID_START,TEST_START") from None
    if a > b:
        raise UsageError(f"--time-cuts {text}: VALID_START must be <= TEST_START")
    return a, b


def _labels(text: str | None) -> list[str]:
    """``--label`` as canonical label expressions (see :mod:`labels`); a bad one is a one-line error."""
    if not text:
        return []
    try:
        return [str(r) for r in parse_labels(text.split(","))]
    except LabelSyntaxError as e:
        raise UsageError(f"--label {text}: {e}") from None


def source_format(args: argparse.Namespace) -> str:
    """--format, else the one format the --src names say (clicks.csv); a UsageError when they say none."""
    fmt = args.format or format_from_names([s.split("=", 1)[1] if s.split("=", 1)[0] in SPLITS else s
                                            for s in args.src or []])
    if not fmt:
        raise UsageError("convert table: --format csv|tsv|parquet|libsvm is required (the --src names do not "
                         "say one format)")
    return fmt


def job_from_args(args: argparse.Namespace) -> TableJob:
    args.format = source_format(args)
    if bool(args.schema) == bool(args.infer_schema):
        raise UsageError("convert table: give exactly one of --schema S.toml and --infer-schema")
    for name in ("valid_frac", "test_frac"):
        v = getattr(args, name)
        if not 0 <= v < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be in [0, 1), got {v}")
    if args.valid_frac + args.test_frac >= 1:
        raise UsageError("--valid-frac + --test-frac must be < 1")
    columns = [c.strip() for c in args.columns.split(",")] if args.columns else None
    sources, mode = _sources(args, columns)
    labels = _labels(args.label)
    notes: list[str] = []
    if args.schema:
        spec = load_spec(args.schema)
        overrides = {"labels": labels, "time": args.time, "surface": args.surface,
                     "min_count": args.min_count, "hash_buckets": args.hash_buckets,
                     "exact_holdout": args.exact_holdout}
        for k, v in overrides.items():
            if v:
                setattr(spec, k, v)
    else:
        if not labels:
            raise UsageError("convert table: --infer-schema needs --label COL[,COL...]")
        first = next(iter(sources.values()))
        schema = first.schema()
        names = schema.names
        sample = first.sample()
        spec = infer_spec(schema, args.table_name or Path(args.out).name, labels,
                          time=args.time or ("ts" if "ts" in names else ""),
                          surface=args.surface or ("surface" if "surface" in names else ""),
                          min_count=args.min_count or DEFAULT_MIN_COUNT,
                          hash_buckets=args.hash_buckets or DEFAULT_HASH_BUCKETS, sample=sample)
        spec.exact_holdout = args.exact_holdout
        notes = mostly_numbers(sample, spec)
    if args.table_name:
        spec.name = args.table_name
    check_spec(spec, f"{args.schema or 'the inferred spec'} with the command-line options")
    if mode == "":
        mode = "time" if spec.time else "random"
    carve = tuple(s for s in ("valid", "test") if s not in sources) if mode == "files" else ()
    if spec.exact_holdout and (mode == "time" or (mode == "files" and not carve)):
        why = "--split time cuts by time" if mode == "time" else "every split has its own --src"
        raise UsageError(f"--exact-holdout (exact_holdout in {args.schema or 'the spec'}) holds rows out of "
                         f"--split random or of the train source under --split files, but {why}")
    rule = SplitRule(mode, args.valid_frac, args.test_frac, args.seed, carve=carve,
                     cuts=_time_cuts(args.time_cuts, mode, spec.time), exact=spec.exact_holdout)
    return TableJob(sources, spec, rule, shuffle=not args.no_shuffle, spec_path=args.schema or "",
                    notes=notes)
