"""The import spec of ``opengem convert table``: which source column becomes what, and its inference.

The spec is a small TOML file a user can read and edit (``--infer-schema`` writes one, ``--schema``
reads it back), unlike the dataset's ``schema.toml``, whose vocabulary sizes only exist after the
conversion. Inference looks at the source's column types only:

- integer and string columns -> sparse features (vocabulary from the train split, min-count, OOV row 0;
  hashed above ``hash_buckets`` values);
- floating-point columns -> dense features, standardised with mean and std from the train split, a
  missing value -> 0 (the mean) plus a ``<name>_missing`` 0/1 indicator (except a CSV column whose
  sample writes every value as an integer: an id too large for int64, parsed by Arrow as a float);
- list columns -> a sequence group of one id field (``<name>__id``), or, for libsvm's ``features``
  bag, a multi-valued sparse feature;
- numbered id columns (``hist_0`` .. ``hist_49``, at least four, no gap) -> one sequence spread over them,
  with ``pad = "0"`` where the sample lays 0 out as a filler (:mod:`infer_spread` says when);
- histories whose sampled event counts agree row for row (``hist_item_id`` and ``hist_cate_id``) -> one
  sequence group, one field per history (``group``; :mod:`infer_group` says when);
- CSV/TSV text columns holding lists joined by ``^`` or ``|`` (``12^7^5``, oldest first; FuxiCTR's and BARS'
  way of writing a history into a CSV cell) -> a sequence read with that ``separator`` (a bag of tags
  written so: a sparse feature with ``multi_valued = true`` and the separator; edit the spec);
- the label, time, surface and example-id columns are roles, not features (a derived label's source
  column, e.g. ``rating`` in ``like=rating>=4``, included: see :mod:`labels`).

``example_id`` and ``ts`` are generated (the source row number, counted over the files in order)
when the spec names no such column; a source column literally called ``example_id`` is used as is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from opengem.config import ConfigError, from_dict
from opengem.data.adapters.infer_group import infer_groups
from opengem.data.adapters.infer_spread import find_spread
from opengem.data.adapters.labels import LabelRule, LabelSyntaxError, parse_label, parse_labels
from opengem.data.adapters.vocab import gather_columns, split_cells
from opengem.data.schema import MAX_EMBEDDING_DIM, SchemaError, dumps_toml, read_toml
from opengem.errors import unknown_key

TRANSFORMS = ("standardize", "log1p", "none")
DEFAULT_MIN_COUNT = 2
DEFAULT_HASH_BUCKETS = 100_000
DEFAULT_MAX_LEN = 50
BAG_COLUMNS = ("features",)  # list columns that are bags of ids (libsvm), not ordered histories
SEPARATORS = ("^", "|")  # what inference takes for a list written into one text cell
MIN_SEPARATED_SHARE = 0.1  # ... when at least this share of the sampled values (and two of them) hold one
MIN_SHARED_OVERLAP = 0.3  # a history shares a feature's vocabulary when this share of its events are in it

HEADER = ("# opengem convert table: import spec. Edit it (kinds, dims, transforms, ignore) and re-run\n"
          "# with --schema THIS_FILE. Roles: labels/time/surface/example_id name source columns;\n"
          "# a label is COL (0/1) or NAME=COL OP NUMBER (OP: >= > <= < == !=), e.g. like=rating>=4;\n"
          "# an empty time or example_id means 'generated from the row number';\n"
          "# exact_holdout = true holds out exactly round(frac * rows) rows (--exact-holdout);\n"
          "# separator: a text column holding a list per cell ('12^7^5', oldest first) is split on it;\n"
          "# share: the sparse feature whose vocabulary and table a sequence's events use; match_recent = k\n"
          "# (with share): count the events equal to it, all and among the latest k (docs/DATA.md);\n"
          "# columns = [...]: a history spread over columns, one event a cell, oldest first (pad: filler);\n"
          "# group = H: these events are another attribute of history H's (the same events, in order).\n")


@dataclass
class SparseSpec:
    name: str
    dim: int = 0  # 0: chosen from the vocabulary size
    hash: bool = False  # hash even when the vocabulary is small
    multi_valued: bool = False
    vocab: int = 0  # > 0: the column already holds ids in [0, vocab), kept as they are (0 = missing)
    separator: str = ""  # multi_valued: a text cell holds the values joined by it ("a|b|c")


@dataclass
class DenseSpec:
    name: str
    transform: str = "standardize"
    missing_indicator: bool = True


@dataclass
class SequenceSpec:
    name: str
    max_len: int = DEFAULT_MAX_LEN
    dim: int = 0
    separator: str = ""  # a text cell holds the history joined by it ("12^7^5", oldest first); "": a list
    share: str = ""  # a sparse feature whose vocabulary and table the events use (a history of ad ids: "ad")
    match_recent: int = 0  # with share, k > 0: the schema's match_features count the events equal to it
    # the history spread over these source columns, one event a cell, oldest first (DMR's Taobao layout: 50
    # columns of category ids); ``name`` is then the history's own name, not a column. Empty cells and cells
    # equal to ``pad`` (the log's filler for a short history, e.g. "0"; by value in a numeric column) are not
    # events.
    columns: list[str] = field(default_factory=list)
    pad: str = ""
    # another [[sequence]] whose events these are a further attribute of (the same events in the same order:
    # a DIN log's hist_cate_id beside hist_item_id, DMR's brand and behaviour type beside the category): one
    # sequence group with one field per attribute, so a model reads each event whole. Each row's lists
    # must have the same length; the group's max_len applies
    group: str = ""

    def output_column(self) -> str:
        """The canonical column of these events: ``<name>__id``, or ``<group>__<name>`` in a group."""
        return f"{self.group}__{self.name}" if self.group else f"{self.name}__id"


@dataclass
class ImportSpec:
    name: str
    labels: list[str]
    time: str = ""
    surface: str = ""
    example_id: str = ""
    min_count: int = DEFAULT_MIN_COUNT
    hash_buckets: int = DEFAULT_HASH_BUCKETS
    exact_holdout: bool = False  # --exact-holdout: hold out exactly round(frac * N) rows (table_split)
    ignore: list[str] = field(default_factory=list)
    sparse: list[SparseSpec] = field(default_factory=list)
    dense: list[DenseSpec] = field(default_factory=list)
    sequence: list[SequenceSpec] = field(default_factory=list)

    @property
    def label_rules(self) -> list[LabelRule]:
        """The labels parsed (``check_spec`` has checked them); task names are ``rule.name``."""
        return parse_labels(self.labels)

    @property
    def task_names(self) -> list[str]:
        return [r.name for r in self.label_rules]

    def source_columns(self) -> list[tuple[str, str]]:
        """Every source column the spec reads (once each), with the role that needs it."""
        out = [(c, "label") for c in dict.fromkeys(r.column for r in self.label_rules)]
        out += [(c, role) for c, role in ((self.time, "time"), (self.surface, "surface"),
                                          (self.example_id, "example_id")) if c]
        out += [(s.name, "sparse") for s in self.sparse] + [(d.name, "dense") for d in self.dense]
        for q in self.sequence:
            out += [(c, "sequence") for c in q.columns] if q.columns else [(q.name, "sequence")]
        return out

    def to_toml(self) -> str:
        return HEADER + dumps_toml(asdict(self))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_toml(), encoding="utf-8")


def load_spec(path: str | Path) -> ImportSpec:
    """Read and check an import spec; an unknown key or a bad value names the key."""
    d = read_toml(path, SchemaError, "import spec")
    return spec_from_dict(d, str(path))


def _only(d: Any, allowed: set[str], where: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise SchemaError(f"{where}: expected a table, got {type(d).__name__}")
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise SchemaError(f"{where}: {unknown_key(unknown[0], allowed, 'allowed')}")
    return d


def spec_from_dict(d: dict[str, Any], where: str) -> ImportSpec:
    top = _only(d, {f for f in ImportSpec.__dataclass_fields__}, where)
    for key in ("name", "labels"):
        if key not in top:
            raise SchemaError(f"{where}: missing required key {key!r}")
    kinds = {"sparse": SparseSpec, "dense": DenseSpec, "sequence": SequenceSpec}
    lists: dict[str, list[Any]] = {}
    for key, cls in kinds.items():
        items = []
        for i, item in enumerate(top.get(key, [])):
            w = f"{where}: {key}[{i}]"
            item = _only(item, set(cls.__dataclass_fields__), w)
            if "name" not in item:
                raise SchemaError(f"{w}: missing required key 'name'")
            try:  # each key's declared type: `hash = "no"` is not true
                items.append(from_dict(cls, item, w))
            except ConfigError as e:
                raise SchemaError(str(e)) from None
        lists[key] = items
    spec = ImportSpec(**{**{k: v for k, v in top.items() if k not in kinds}, **lists})
    check_spec(spec, where)
    return spec


def check_spec(spec: ImportSpec, where: str) -> None:
    if not isinstance(spec.labels, list) or not spec.labels or not all(isinstance(c, str) and c
                                                                       for c in spec.labels):
        raise SchemaError(f"{where}: labels must be a non-empty list of column names or expressions")
    for i, text in enumerate(spec.labels):
        try:
            parse_label(text)
        except LabelSyntaxError as e:
            raise SchemaError(f"{where}: labels[{i}]: {e}") from None
    try:
        rules = parse_labels(spec.labels)
    except LabelSyntaxError as e:
        raise SchemaError(f"{where}: labels: {e}") from None
    outputs = {s.name for s in spec.sparse} | {q.output_column() for q in spec.sequence}
    for d in spec.dense:
        outputs |= {d.name, f"{d.name}_missing"}
    clash = [r.name for r in rules if r.name in outputs]
    if clash:
        raise SchemaError(f"{where}: label {clash[0]!r} has the name of a feature column: name it "
                          "NAME=COL OP NUMBER with another NAME")
    if not isinstance(spec.min_count, int) or spec.min_count < 1:
        raise SchemaError(f"{where}: min_count must be an integer >= 1, got {spec.min_count!r}")
    if not isinstance(spec.exact_holdout, bool):
        raise SchemaError(f"{where}: exact_holdout must be true or false, got {spec.exact_holdout!r}")
    if not isinstance(spec.hash_buckets, int) or spec.hash_buckets < 2:
        raise SchemaError(f"{where}: hash_buckets must be an integer >= 2, got {spec.hash_buckets!r}")
    for i, d in enumerate(spec.dense):
        if d.transform not in TRANSFORMS:
            raise SchemaError(f"{where}: dense[{i}].transform: {d.transform!r} is not one of "
                              f"{', '.join(TRANSFORMS)}")
    for key, items in (("sparse", spec.sparse), ("sequence", spec.sequence)):
        for i, item in enumerate(items):
            if not 0 <= item.dim <= MAX_EMBEDDING_DIM:
                raise SchemaError(f"{where}: {key}[{i}].dim: 0 (chosen from the vocabulary size) or an "
                                  f"embedding width up to {MAX_EMBEDDING_DIM}, got {item.dim}")
    for i, s in enumerate(spec.sparse):
        if s.vocab < 0:
            raise SchemaError(f"{where}: sparse[{i}].vocab: 0 (fitted) or the ids' range, got {s.vocab}")
    sparse_names = {s.name for s in spec.sparse}
    heads = {q.name for q in spec.sequence if not q.group}
    for i, q in enumerate(spec.sequence):
        if not isinstance(q.group, str) or (q.group and q.group not in heads):
            known = ", ".join(sorted(heads)) or "none"
            raise SchemaError(f"{where}: sequence[{i}].group: {q.group!r} is not the name of another "
                              f"[[sequence]] of the spec outside any group ({known})")
        if q.group and q.name == "id":
            raise SchemaError(f"{where}: sequence[{i}]: a grouped history may not be called 'id' (the name "
                              "of its group's first field)")
        if not isinstance(q.max_len, int) or q.max_len < 1:
            raise SchemaError(f"{where}: sequence[{i}].max_len must be an integer >= 1")
        if not isinstance(q.match_recent, int) or q.match_recent < 0 or (q.match_recent and not q.share):
            raise SchemaError(f"{where}: sequence[{i}].match_recent must be an integer >= 0, and > 0 only "
                              f"with share (got {q.match_recent!r}, share {q.share!r})")
        if not isinstance(q.columns, list) or not all(isinstance(c, str) and c for c in q.columns):
            raise SchemaError(f"{where}: sequence[{i}].columns must be a list of column names, got "
                              f"{q.columns!r}")
        if not isinstance(q.pad, str) or (q.pad and not q.columns):
            raise SchemaError(f"{where}: sequence[{i}].pad: a string, and only with columns (a history "
                              f"spread over columns), got {q.pad!r}")
        if q.columns and q.separator:
            raise SchemaError(f"{where}: sequence[{i}] ({q.name!r}) has both columns and a separator: a "
                              "history spread over columns holds one event a cell")
        if not isinstance(q.share, str) or (q.share and q.share not in sparse_names):
            raise SchemaError(f"{where}: sequence[{i}].share: {q.share!r} is not a sparse feature of the "
                              f"spec ({', '.join(sorted(sparse_names)) or 'none'})")
    for key, items in (("sparse", spec.sparse), ("sequence", spec.sequence)):
        for i, item in enumerate(items):
            sep = item.separator
            if not isinstance(sep, str) or sep.strip() != sep:
                raise SchemaError(f"{where}: {key}[{i}].separator must be a string without spaces at its "
                                  f"ends, got {sep!r}")
            if sep and key == "sparse" and not item.multi_valued:
                raise SchemaError(f"{where}: sparse[{i}] ({item.name!r}) has a separator but multi_valued = "
                                  "false: a cell split into values is a multi-valued feature (or a sequence)")
    seen: dict[str, str] = {}
    for col, role in spec.source_columns():
        if col in seen and {seen[col], role} != {"surface", "sparse"}:
            raise SchemaError(f"{where}: column {col!r} is used twice ({seen[col]} and {role})")
        seen[col] = role
    for i, q in enumerate(spec.sequence):
        if q.columns and q.name in seen:
            raise SchemaError(f"{where}: sequence[{i}] ({q.name!r}) is spread over columns, so its name must "
                              "not be a column the spec reads: give the history a name of its own")


def _sampled_text(sample: pa.RecordBatch | None, name: str) -> pa.Array | None:
    """The non-null sampled values of a column read as text (a CSV sample), or None: no sample, no such
    column, or a typed one (Parquet keeps its types)."""
    if sample is None or name not in sample.schema.names:
        return None
    col = sample.column(name).drop_null()
    return col if pa.types.is_string(col.type) or pa.types.is_large_string(col.type) else None


def _integer_text(sample: pa.RecordBatch | None, name: str) -> bool:
    """True when every non-empty sample value of a column is written as an integer (no '.', no 'e'); a
    sample read with types (Parquet) keeps its floats."""
    col = _sampled_text(sample, name)
    return col is not None and len(col) > 0 and bool(
        pc.all(pc.match_substring_regex(col, r"^\s*-?\d+\s*$")).as_py())


NUMBER_TEXT = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"
MOSTLY_NUMBERS = 0.9  # a text column with this share of real numbers among its sampled values: dense + typos


def mostly_numbers(sample: pa.RecordBatch | None, spec: ImportSpec) -> list[str]:
    """One line per categorical feature inferred from a text column whose sampled values are almost all real
    numbers (at least MOSTLY_NUMBERS of the non-empty ones, some with a fraction or an exponent) but not all:
    one cell such as 'abc' or 'unknown' in a price column makes the whole column text, so inference files it
    as categorical, where the user almost surely wanted it dense. Integer-only columns are ids: not named."""
    lines = []
    for f in spec.sparse:
        col = _sampled_text(sample, f.name)
        if col is None:
            continue
        col = col.filter(pc.not_equal(pc.utf8_trim_whitespace(col), ""))
        numeric = pc.match_substring_regex(col, NUMBER_TEXT)
        n, k = len(col), int(pc.sum(pc.cast(numeric, pa.int64())).as_py() or 0)
        fractional = pc.any(pc.and_(numeric, pc.match_substring_regex(col, r"[.eE]"))).as_py()
        if n == 0 or k == n or k < MOSTLY_NUMBERS * n or not fractional:
            continue
        odd = pc.unique(col.filter(pc.invert(numeric))).to_pylist()
        shown = ", ".join(repr(v[:20]) for v in odd[:3]) + (", ..." if len(odd) > 3 else "")
        lines.append(f"{f.name}: {k} of {n} sampled values are numbers, but not {shown}; so it is inferred "
                     "as categorical (sparse). If it is a number, move it under dense in the spec (and fix "
                     "or blank those cells: a dense cell that is not a number stops the conversion)")
    return lines


def _separator(sample: pa.RecordBatch | None, name: str) -> str:
    """The separator a text column's sampled cells join lists with ("" when they do not): at least two
    values and MIN_SEPARATED_SHARE of the non-empty ones hold it."""
    if sample is None or name not in sample.schema.names:
        return ""
    col = pc.cast(sample.column(name).drop_null(), pa.string())
    col = col.filter(pc.not_equal(col, ""))
    for sep in SEPARATORS:
        k = int(pc.sum(pc.cast(pc.match_substring(col, sep), pa.int64())).as_py() or 0) if len(col) else 0
        if k >= 2 and k >= MIN_SEPARATED_SHARE * len(col):
            return sep
    return ""


def infer_share(sample: pa.RecordBatch | None, seq: SequenceSpec, sparse: list[SparseSpec]) -> str:
    """The sparse feature a history's events are ids of: the longest one whose name, or its name without
    an ``_id``/``id`` ending, is part of the history's (``item_id`` in ``hist_item_id``, ``item`` in
    ``item_history``) whose sampled distinct values overlap the sampled events' the most, the overlap
    counted as a share of the smaller of the two sets and at least MIN_SHARED_OVERLAP ("" when none; numbers
    alone would not tell a user id from an item id, so the name proposes and the sample chooses; without a
    sample, the longest name). The smaller set: a long history holds more distinct values than a sample's
    ads (DMR's category histories: 13 % of theirs among the ads' categories, 85 % of the ads' among them)."""
    def stem(name: str) -> str:
        cut = name.removesuffix("_id").removesuffix("id")
        return cut if len(cut) >= 2 else name

    named = sorted((s for s in sparse if stem(s.name) in seq.name and not s.multi_valued),
                   key=lambda s: -len(s.name))
    read = seq.columns or [seq.name]
    if not named or sample is None or not all(c in sample.schema.names for c in read):
        return named[0].name if named else ""
    if seq.columns:  # a history spread over columns: its events as the importer gathers them (as text)
        events = pc.list_flatten(gather_columns([pc.cast(sample.column(c), pa.string()) for c in seq.columns],
                                                seq.pad))
    else:
        col = sample.column(seq.name)
        events = pc.list_flatten(split_cells(col, seq.separator)) if seq.separator else pc.list_flatten(col)
    events = pc.unique(pc.cast(events, pa.string()))
    best, best_share = "", 0.0
    for s in named:
        if s.name not in sample.schema.names or len(events) == 0:
            continue
        values = pc.unique(pc.cast(sample.column(s.name).drop_null(), pa.string()))
        hit = int(pc.sum(pc.cast(pc.is_in(events, value_set=values), pa.int64())).as_py() or 0)
        share = hit / max(1, min(len(events), len(values)))
        if share >= MIN_SHARED_OVERLAP and share > best_share:
            best, best_share = s.name, share
    return best


def infer_spec(source: pa.Schema, name: str, labels: list[str], time: str = "", surface: str = "",
               min_count: int = DEFAULT_MIN_COUNT, hash_buckets: int = DEFAULT_HASH_BUCKETS,
               sample: pa.RecordBatch | None = None) -> ImportSpec:
    """An import spec from the source's column types (see the module docstring); ``sample`` (the first
    rows: CSV as text, Parquet as stored) turns a 'float' column written as integers too large for int64 (a
    uint64 id) into a sparse one, finds the text columns whose cells join lists, and the feature whose
    values each history's events are. Numbered id columns that read as one history spread over columns
    (``hist_0`` .. ``hist_49``) become one sequence with ``columns`` (see :mod:`infer_spread`); histories
    whose sampled event counts agree row for row become one group (see :mod:`infer_group`)."""
    example_id = "example_id" if "example_id" in source.names else ""
    roles = {*(parse_label(t).column for t in labels), time, surface, example_id}
    spec = ImportSpec(name=name, labels=list(labels), time=time, surface=surface, example_id=example_id,
                      min_count=min_count, hash_buckets=hash_buckets)
    spread = find_spread(source, sample, roles)
    for history, columns, pad in spread:
        spec.sequence.append(SequenceSpec(history, max_len=min(len(columns), DEFAULT_MAX_LEN),
                                          columns=columns, pad=pad))
    taken = roles | {c for _, columns, _ in spread for c in columns}
    for f in source:
        if f.name in taken:
            continue
        t = f.type
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            if f.name in BAG_COLUMNS:
                spec.sparse.append(SparseSpec(f.name, multi_valued=True))
            else:
                spec.sequence.append(SequenceSpec(f.name))
        elif (pa.types.is_floating(t) or pa.types.is_decimal(t)) and not _integer_text(sample, f.name):
            spec.dense.append(DenseSpec(f.name))
        elif (pa.types.is_string(t) or pa.types.is_large_string(t)) and (sep := _separator(sample, f.name)):
            spec.sequence.append(SequenceSpec(f.name, separator=sep))
        elif (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_string(t)
              or pa.types.is_large_string(t) or pa.types.is_boolean(t) or pa.types.is_dictionary(t)):
            spec.sparse.append(SparseSpec(f.name))
        else:
            spec.ignore.append(f.name)  # timestamps, binary, structs: not a feature without a decision
    for q in spec.sequence:
        q.share = infer_share(sample, q, spec.sparse)
    infer_groups(sample, spec.sequence)
    return spec
