"""FeatureSchema: the declared shape of every dataset opengem reads.

The schema is the contract between data and model: the simulator, the adapters, the validator, the
loader and the embedding layer all read it, so one TOML file describes a dataset completely. Loading
is strict: an unknown key, a duplicate name, a task without a column or a negative size fails with a
message naming the offending key, because a silently ignored typo in a schema becomes a silently wrong
model.

Canonical Parquet column names follow from the schema:
- each sparse feature is a column of its name (int64, or list<int64> when ``multi_valued``);
- each dense feature is a float column of its name;
- each sequence field is a list column named ``<group>__<field>`` (oldest event first);
- ``example_id`` (int64), the time column (int64), the surface column (int32 index into
  ``surfaces``) and one float column per task label (null = not observed).

``time_features`` (``hour_of_day``, ``day_of_week``) are not columns: each is a (sin, cos) pair derived from
the time column (in ``time_unit`` since the Unix epoch) and appended after the dense features
(:mod:`opengem.data.time_features`). A model's dense input is therefore ``dense_input_names`` /
``num_dense_inputs`` wide, never ``len(dense)``. A schema without the key has none, so data, runs and
artifacts written before it existed load and batch exactly as before.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from opengem.data.match_features import MatchFeature, match_feature_names
from opengem.data.time_features import TIME_FEATURES, TIME_UNITS, time_feature_names
from opengem.errors import OpengemError, unknown_key

POOLINGS = ("sum", "mean")
OOV_POLICIES = ("error", "hash", "clamp", "skip")
NAN_POLICIES = ("error", "zero", "skip")
OVERFLOW_POLICIES = ("error", "truncate", "skip")
SEQ_FIELD_KINDS = ("id", "dense")
SEQ_SEP = "__"


class SchemaError(OpengemError, ValueError):
    """A schema file or dict that does not describe a valid dataset."""


@dataclass(frozen=True)
class SparseFeature:
    """A categorical feature looked up in an embedding table.

    ``vocab`` is the number of ids (ids must lie in [0, vocab)). ``table`` names the embedding table;
    features (and sequence fields) that name the same table share it, e.g. the ad being ranked and
    the ads in a user's history. ``on_oov`` says what to do with an id outside the vocabulary.
    """

    name: str
    vocab: int
    dim: int = 16
    pooling: str = "sum"
    multi_valued: bool = False
    table: str = ""
    on_oov: str = "error"

    @property
    def table_name(self) -> str:
        return self.table or self.name


@dataclass(frozen=True)
class DenseFeature:
    name: str
    on_nan: str = "error"


@dataclass(frozen=True)
class SequenceField:
    """One aligned per-event field of a sequence group (item id, action type, time delta ...)."""

    name: str
    kind: str = "id"
    vocab: int = 0
    dim: int = 16
    table: str = ""
    on_oov: str = "error"
    on_nan: str = "error"

    @property
    def table_name(self) -> str:
        return self.table or self.name


@dataclass(frozen=True)
class SequenceGroup:
    """Per-event fields that share one length per row (a behaviour history)."""

    name: str
    max_len: int
    fields: tuple[SequenceField, ...]
    on_overflow: str = "error"

    def column(self, field_name: str) -> str:
        return f"{self.name}{SEQ_SEP}{field_name}"

    @property
    def id_fields(self) -> tuple[SequenceField, ...]:
        return tuple(f for f in self.fields if f.kind == "id")

    @property
    def dense_fields(self) -> tuple[SequenceField, ...]:
        return tuple(f for f in self.fields if f.kind == "dense")


@dataclass(frozen=True)
class Task:
    name: str
    column: str = ""
    weight: float = 1.0

    @property
    def label_column(self) -> str:
        return self.column or self.name


@dataclass(frozen=True)
class FeatureSchema:
    name: str
    surfaces: tuple[str, ...]
    tasks: tuple[Task, ...]
    sparse: tuple[SparseFeature, ...] = ()
    dense: tuple[DenseFeature, ...] = ()
    sequences: tuple[SequenceGroup, ...] = ()
    surface_column: str = "surface"
    time_column: str = "ts"
    example_id_column: str = "example_id"
    on_error: str = "error"
    time_features: tuple[str, ...] = ()  # of TIME_FEATURES: (sin, cos) pairs derived from time_column
    time_unit: str = "s"  # of TIME_UNITS: the time column's ticks (Unix epoch, UTC)
    match_features: tuple[MatchFeature, ...] = ()  # history-vs-item counts derived in to_batch
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    # ----------------------------------------------------------------- derived names
    @property
    def task_names(self) -> list[str]:
        return [t.name for t in self.tasks]

    @property
    def sparse_names(self) -> list[str]:
        return [f.name for f in self.sparse]

    @property
    def dense_names(self) -> list[str]:
        return [f.name for f in self.dense]

    @property
    def time_feature_names(self) -> list[str]:
        """The derived time inputs (``hour_of_day_sin``, ``hour_of_day_cos``, ...); not Parquet columns."""
        return time_feature_names(self.time_features)

    @property
    def match_feature_names(self) -> list[str]:
        """The derived history-vs-item counts (:mod:`opengem.data.match_features`); not Parquet columns."""
        return match_feature_names(self.match_features)

    @property
    def dense_input_names(self) -> list[str]:
        """The columns of ``Batch.dense``: the dense features, then the derived time and match features."""
        return self.dense_names + self.time_feature_names + self.match_feature_names

    @property
    def num_dense_inputs(self) -> int:
        """Width of ``Batch.dense``: what every model, FLOP count and exported input is sized by."""
        return len(self.dense) + len(self.time_feature_names) + len(self.match_feature_names)

    def sequence(self, name: str) -> SequenceGroup:
        for g in self.sequences:
            if g.name == name:
                return g
        raise KeyError(f"schema {self.name!r} has no sequence group {name!r}")

    def sparse_feature(self, name: str) -> SparseFeature:
        for f in self.sparse:
            if f.name == name:
                return f
        raise KeyError(f"schema {self.name!r} has no sparse feature {name!r}")

    def feature_columns(self) -> list[str]:
        """Every column a model may read (labels and bookkeeping excluded)."""
        cols = [f.name for f in self.sparse] + [f.name for f in self.dense]
        for g in self.sequences:
            cols += [g.column(f.name) for f in g.fields]
        return cols

    def required_columns(self) -> list[str]:
        return (
            [self.example_id_column, self.time_column, self.surface_column]
            + self.feature_columns()
            + [t.label_column for t in self.tasks]
        )

    def tables(self) -> dict[str, tuple[int, int]]:
        """Embedding tables as name -> (vocab, dim), shared tables merged (largest vocab wins)."""
        out: dict[str, tuple[int, int]] = {}
        specs: list[tuple[str, int, int]] = [(f.table_name, f.vocab, f.dim) for f in self.sparse]
        for g in self.sequences:
            specs += [(f.table_name, f.vocab, f.dim) for f in g.id_fields]
        for name, vocab, dim in specs:
            if name in out and out[name][1] != dim:
                raise SchemaError(f"table {name!r} is shared by features of different dims")
            out[name] = (max(vocab, out.get(name, (0, dim))[0]), dim)
        return out

    # ----------------------------------------------------------------- (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "surfaces": list(self.surfaces),
            "surface_column": self.surface_column,
            "time_column": self.time_column,
            "example_id_column": self.example_id_column,
            "on_error": self.on_error,
            "sparse": [_asdict(f) for f in self.sparse],
            "dense": [_asdict(f) for f in self.dense],
            "sequence": [
                {
                    "name": g.name,
                    "max_len": g.max_len,
                    "on_overflow": g.on_overflow,
                    "fields": [_asdict(f) for f in g.fields],
                }
                for g in self.sequences
            ],
            "task": [_asdict(t) for t in self.tasks],
        }
        # written only when set, so a schema without time features serialises exactly as before they existed
        if self.time_features:
            d["time_features"] = list(self.time_features)
        if self.time_features or self.time_unit != "s":
            d["time_unit"] = self.time_unit
        if self.match_features:
            d["match_features"] = [_asdict(m) for m in self.match_features]
        if self.extra:
            d["extra"] = dict(self.extra)
        return d

    def to_toml(self) -> str:
        return dumps_toml(self.to_dict())

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_toml(), encoding="utf-8")  # read_toml reads UTF-8, whatever the locale

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "<dict>") -> FeatureSchema:
        return _parse_schema(d, source)

    @classmethod
    def load(cls, path: str | Path) -> FeatureSchema:
        return _parse_schema(read_toml(path, SchemaError, "schema"), str(path))


# --------------------------------------------------------------------------- parsing
def _asdict(obj: Any) -> dict[str, Any]:
    out = {}
    for k in obj.__dataclass_fields__:
        v = getattr(obj, k)
        if v == "" or v is None:
            continue
        out[k] = v
    return out


def _take(d: dict[str, Any], allowed: dict[str, type | tuple[type, ...]], where: str,
          required: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise SchemaError(f"{where}: expected a table, got {type(d).__name__}")
    for k in d:
        if k not in allowed:
            raise SchemaError(f"{where}: {unknown_key(k, allowed, 'allowed')}")
    for k in required:
        if k not in d:
            raise SchemaError(f"{where}: missing required key {k!r}")
    for k, v in d.items():
        types = allowed[k]
        if isinstance(v, bool) and types in (int, float, (int, float)):
            raise SchemaError(f"{where}.{k}: expected a number, got {v!r}")
        if not isinstance(v, types):
            raise SchemaError(f"{where}.{k}: wrong type {type(v).__name__} (value {v!r})")
    return d


def _check_choice(value: str, choices: tuple[str, ...], where: str) -> None:
    if value not in choices:
        raise SchemaError(f"{where}: {value!r} is not one of {', '.join(choices)}")


def _check_positive(value: int, where: str, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise SchemaError(f"{where}: must be {'>= 0' if allow_zero else '> 0'}, got {value}")


# The widest embedding row a schema may ask for: a table of 1,000 rows this wide is already 32 MiB; a dim past
# it is a typo (1e11 made training fail inside the allocator), not a model.
MAX_EMBEDDING_DIM = 8192


def _check_dim(value: int, where: str) -> None:
    if not 0 < value <= MAX_EMBEDDING_DIM:
        raise SchemaError(f"{where}: an embedding width in [1, {MAX_EMBEDDING_DIM}], got {value}")


def _parse_schema(d: dict[str, Any], src: str) -> FeatureSchema:
    top = _take(
        d,
        {
            "name": str, "surfaces": list, "surface_column": str, "time_column": str,
            "example_id_column": str, "on_error": str, "sparse": list, "dense": list,
            "sequence": list, "task": list, "extra": dict, "time_features": list, "time_unit": str,
            "match_features": list,
        },
        src,
        required=("name", "surfaces", "task"),
    )
    on_error = top.get("on_error", "error")
    _check_choice(on_error, ("error", "skip"), f"{src}: on_error")
    default_oov = "error" if on_error == "error" else "skip"
    default_nan = "error" if on_error == "error" else "skip"
    default_overflow = "error" if on_error == "error" else "truncate"

    surfaces = top["surfaces"]
    if not surfaces or not all(isinstance(s, str) for s in surfaces):
        raise SchemaError(f"{src}: surfaces must be a non-empty list of names")
    if len(set(surfaces)) != len(surfaces):
        raise SchemaError(f"{src}: surfaces has a duplicate name")

    names: dict[str, str] = {}

    def claim(name: str, where: str) -> None:
        if not name:
            raise SchemaError(f"{where}: empty name")
        if SEQ_SEP in name:
            raise SchemaError(f"{where}: name {name!r} may not contain {SEQ_SEP!r}")
        if name in names:
            raise SchemaError(f"{where}: duplicate name {name!r} (already used by {names[name]})")
        names[name] = where

    sparse = []
    for i, s in enumerate(top.get("sparse", [])):
        where = f"{src}: sparse[{i}]"
        s = _take(s, {"name": str, "vocab": int, "dim": int, "pooling": str,
                      "multi_valued": bool, "table": str, "on_oov": str}, where, ("name", "vocab"))
        claim(s["name"], where)
        _check_positive(s["vocab"], f"{where}.vocab")
        _check_dim(s.get("dim", 16), f"{where}.dim")
        _check_choice(s.get("pooling", "sum"), POOLINGS, f"{where}.pooling")
        s.setdefault("on_oov", default_oov)
        _check_choice(s["on_oov"], OOV_POLICIES, f"{where}.on_oov")
        sparse.append(SparseFeature(**s))

    dense = []
    for i, s in enumerate(top.get("dense", [])):
        where = f"{src}: dense[{i}]"
        s = _take(s, {"name": str, "on_nan": str}, where, ("name",))
        claim(s["name"], where)
        s.setdefault("on_nan", default_nan)
        _check_choice(s["on_nan"], NAN_POLICIES, f"{where}.on_nan")
        dense.append(DenseFeature(**s))

    groups = []
    for i, g in enumerate(top.get("sequence", [])):
        where = f"{src}: sequence[{i}]"
        g = _take(g, {"name": str, "max_len": int, "fields": list, "on_overflow": str}, where,
                  ("name", "max_len", "fields"))
        claim(g["name"], where)
        _check_positive(g["max_len"], f"{where}.max_len")
        overflow = g.get("on_overflow", default_overflow)
        _check_choice(overflow, OVERFLOW_POLICIES, f"{where}.on_overflow")
        if not g["fields"]:
            raise SchemaError(f"{where}.fields: a sequence group needs at least one field")
        fields = []
        seen: set[str] = set()
        for j, f in enumerate(g["fields"]):
            fwhere = f"{where}.fields[{j}]"
            f = _take(f, {"name": str, "kind": str, "vocab": int, "dim": int, "table": str,
                          "on_oov": str, "on_nan": str}, fwhere, ("name",))
            if f["name"] in seen:
                raise SchemaError(f"{fwhere}: duplicate field name {f['name']!r}")
            seen.add(f["name"])
            kind = f.get("kind", "id")
            _check_choice(kind, SEQ_FIELD_KINDS, f"{fwhere}.kind")
            if kind == "id":
                if "vocab" not in f:
                    raise SchemaError(f"{fwhere}: missing required key 'vocab' for an id field")
                _check_positive(f["vocab"], f"{fwhere}.vocab")
            _check_dim(f.get("dim", 16), f"{fwhere}.dim")
            f.setdefault("on_oov", default_oov)
            f.setdefault("on_nan", default_nan)
            _check_choice(f["on_oov"], OOV_POLICIES, f"{fwhere}.on_oov")
            _check_choice(f["on_nan"], NAN_POLICIES, f"{fwhere}.on_nan")
            fields.append(SequenceField(**f))
        if not any(f.kind == "id" for f in fields):
            raise SchemaError(f"{where}.fields: a sequence group needs at least one id field")
        groups.append(SequenceGroup(name=g["name"], max_len=g["max_len"], fields=tuple(fields),
                                    on_overflow=overflow))

    time_features = _parse_time_features(top.get("time_features", []), src)
    time_unit = top.get("time_unit", "s")
    _check_choice(time_unit, tuple(TIME_UNITS), f"{src}: time_unit")
    for name in time_feature_names(time_features):
        claim(name, f"{src}: time_features (derived input)")
    match_features = _parse_match_features(top.get("match_features", []), src, sparse, groups)
    for name in match_feature_names(match_features):
        claim(name, f"{src}: match_features (derived input)")

    tasks = []
    if not top["task"]:
        raise SchemaError(f"{src}: task: at least one task is required")
    task_names: set[str] = set()
    for i, t in enumerate(top["task"]):
        where = f"{src}: task[{i}]"
        t = _take(t, {"name": str, "column": str, "weight": (int, float)}, where, ("name",))
        if "column" in t and not t["column"]:
            raise SchemaError(f"{where}.column: a task needs a label column")
        if t["name"] in task_names:
            raise SchemaError(f"{where}: duplicate task name {t['name']!r}")
        task_names.add(t["name"])
        if not 0 <= t.get("weight", 1.0) < math.inf:  # NaN fails too (it made every loss NaN)
            raise SchemaError(f"{where}.weight: must be a finite number >= 0, got {t['weight']}")
        task = Task(name=t["name"], column=t.get("column", ""), weight=float(t.get("weight", 1.0)))
        if task.label_column in names:
            raise SchemaError(f"{where}.column: {task.label_column!r} is also a feature")
        tasks.append(task)

    schema = FeatureSchema(
        name=top["name"],
        surfaces=tuple(surfaces),
        tasks=tuple(tasks),
        sparse=tuple(sparse),
        dense=tuple(dense),
        sequences=tuple(groups),
        surface_column=top.get("surface_column", "surface"),
        time_column=top.get("time_column", "ts"),
        example_id_column=top.get("example_id_column", "example_id"),
        on_error=on_error,
        time_features=time_features,
        time_unit=time_unit,
        match_features=match_features,
        extra=dict(top.get("extra", {})),
    )
    schema.tables()  # validates shared-table dims
    return schema


def _parse_match_features(value: list[Any], src: str, sparse: list[SparseFeature],
                          groups: list[SequenceGroup]) -> tuple[MatchFeature, ...]:
    """``match_features`` entries; each pairs a sequence id field with a single-valued sparse feature on
    the same table (else equal ids would not be the same value)."""
    out = []
    for i, m in enumerate(value):
        where = f"{src}: match_features[{i}]"
        if not isinstance(m, dict):
            raise SchemaError(f"{where}: expected a table {{ sequence, field, feature, recent }}, got {m!r}")
        m = _take(m, {"sequence": str, "field": str, "feature": str, "recent": int}, where,
                  ("sequence", "field", "feature"))
        group = next((g for g in groups if g.name == m["sequence"]), None)
        if group is None:
            raise SchemaError(f"{where}.sequence: no sequence group {m['sequence']!r}")
        fld = next((f for f in group.id_fields if f.name == m["field"]), None)
        if fld is None:
            raise SchemaError(f"{where}.field: {m['field']!r} is not an id field of {group.name!r} "
                              f"({', '.join(f.name for f in group.id_fields)})")
        feat = next((f for f in sparse if f.name == m["feature"]), None)
        if feat is None or feat.multi_valued:
            raise SchemaError(f"{where}.feature: {m['feature']!r} is not a single-valued sparse feature")
        if feat.table_name != fld.table_name:
            raise SchemaError(f"{where}: {feat.name!r} (table {feat.table_name!r}) and {group.name}."
                              f"{fld.name} (table {fld.table_name!r}) do not share a table, so equal ids "
                              "are not the same value")
        _check_positive(m.get("recent", 8), f"{where}.recent")
        out.append(MatchFeature(m["sequence"], m["field"], m["feature"], m.get("recent", 8)))
    return tuple(out)


def _parse_time_features(value: list[Any], src: str) -> tuple[str, ...]:
    where = f"{src}: time_features"
    for v in value:
        if not isinstance(v, str):
            raise SchemaError(f"{where}: expected names, got {v!r}")
        _check_choice(v, TIME_FEATURES, where)
    if len(set(value)) != len(value):
        raise SchemaError(f"{where}: duplicate name in {value!r}")
    return tuple(value)


# --------------------------------------------------------------------------- TOML reading and writing
def read_toml(path: str | Path, error: type[Exception], what: str) -> dict[str, Any]:
    """Read a TOML file, turning each way it can be unreadable into one ``error`` naming the path.

    Shared by the schema and config loaders (``opengem.config`` imports it from here, the lower module):
    a folder, a missing file, non-UTF-8 bytes or a TOML syntax error becomes one line the CLI can print,
    not a traceback.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise error(f"{p}: {what} file not found") from None
    except IsADirectoryError:
        raise error(f"{p}: is a folder; give the path of a {what} TOML file") from None
    except PermissionError:
        raise error(f"{p}: permission denied reading the {what} file") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise error(f"{p}: not UTF-8 text (line {line}, byte {e.start}: {e.reason}); "
                    f"save the {what} file as UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise error(f"{p}: not valid TOML: {e}") from None


def dumps_toml(d: dict[str, Any]) -> str:
    """TOML text that ``tomllib`` reads back to ``d`` exactly (None values omitted: TOML has no null).

    Written by tomli_w, not by hand: a resolved run config must round-trip exactly (an empty list, an
    empty table, 1e-8, a quoted or non-ASCII string, a dotted key), or ``evaluate`` and ``--resume``
    rebuild a different model than the one trained.
    """
    return tomli_w.dumps(_drop_none(d))


def _drop_none(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _drop_none(x) for k, x in v.items() if x is not None}
    if isinstance(v, (list, tuple)):
        return [_drop_none(x) for x in v]
    return v


def schema_differences(a: FeatureSchema, b: FeatureSchema) -> list[str]:
    """What a model trained on schema ``a`` cannot read in data of schema ``b``: ``"<what> <a> vs <b>"`` each
    (surfaces, tasks, features, tables, sequence groups); [] when it reads it."""
    diffs = []
    for what, get in (("surfaces", lambda s: list(s.surfaces)), ("tasks", lambda s: s.task_names),
                      ("sparse features", lambda s: s.sparse_names),
                      ("dense features", lambda s: s.dense_names),
                      ("tables (name: rows, dim)", lambda s: s.tables()),
                      ("sequence groups", lambda s: [(g.name, g.max_len) for g in s.sequences])):
        x, y = get(a), get(b)
        if x != y:
            diffs.append(f"{what} {_short(x)} vs {_short(y)}")
    return diffs


def _short(x: Any, most: int = 5) -> str:
    """A list or dict as shown in a one-line error: its first ``most`` items, then how many more."""
    items = [f"{k}: {v}" for k, v in x.items()] if isinstance(x, dict) else [str(v) for v in x]
    more = f", ... {len(items) - most} more" if len(items) > most else ""
    return f"[{', '.join(items[:most])}{more}]"
