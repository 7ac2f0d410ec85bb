"""Raw request values -> the model's Batch, through the loader's own code path.

A request is ``{"surface": name | index, "context": {feature: value}, "candidates": [{feature: value}, ...]}``
with feature names as in canonical Parquet (sparse and dense feature names, ``<group>__<field>`` for
sequence fields). Context features are broadcast to every candidate; every feature the schema declares
must come from exactly one of the two.

Training/serving skew is impossible by construction because, after a type check, the rows take the path
the loader's rows take: an Arrow table in the canonical schema -> ``conform_table`` ->
``Columns.from_arrow`` -> ``check_columns`` (the schema's OOV hashing/clamping, NaN and overflow
policies) -> ``to_batch``. For datasets whose raw values are ids (the simulator's) that is the whole
encoding, and a vertical model's schema hashes out-of-vocabulary ids here exactly as its loader did; for a
dataset made by ``opengem convert table`` whose encoders the artifact carries, the importer's own
``Encoders.encode`` comes first (:mod:`opengem.serve.table_codec`). Every problem is a one-line
:class:`BadRequest`; a row the schema would skip is refused (a candidate cannot go unscored).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from opengem.data.adapters.common import AdapterError
from opengem.data.adapters.table_encode import Encoders
from opengem.data.batch import Batch
from opengem.data.dataset import arrow_schema
from opengem.data.parquet import Columns, DataError, ProblemLog, check_columns, conform_table, to_batch
from opengem.data.schema import FeatureSchema
from opengem.serve.errors import BadRequest
from opengem.serve.table_codec import TABLE, encode_raw, encoders_from_json, raw_batch, raw_columns

REQUEST = "request"  # the "file" named in the loader's problem messages
DEFAULT_MAX_CANDIDATES = 4096
REQUEST_KEYS = ("surface", "context", "candidates")
_ABSENT = object()  # a feature a candidate did not give (None is a value: a missing number)


@dataclass(frozen=True)
class _Column:
    name: str
    kind: str  # "id" | "ids" | "float" | "floats"; raw source values: "cat" | "cats" (ids or strings), "num"
    max_len: int = 0  # sequences: the declared max_len (longer is the schema's on_overflow)


def request_columns(schema: FeatureSchema) -> dict[str, _Column]:
    """Every feature a request must carry, with the kind of value it takes."""
    cols = {f.name: _Column(f.name, "ids" if f.multi_valued else "id") for f in schema.sparse}
    cols.update({f.name: _Column(f.name, "float") for f in schema.dense})
    for g in schema.sequences:
        for f in g.fields:
            kind = "ids" if f.kind == "id" else "floats"
            cols[g.column(f.name)] = _Column(g.column(f.name), kind, g.max_len)
    return cols


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _is_cat(v: Any) -> bool:
    return _is_int(v) or isinstance(v, str)


def _check_value(col: _Column, v: Any, where: str) -> Any:
    """The value if it has the column's type, else a BadRequest naming the feature."""
    if col.kind == "cat":
        if not _is_cat(v):
            raise BadRequest(f"{where}: feature {col.name!r} takes one id or string, got {type(v).__name__}")
        return v
    if col.kind == "num":
        if v is not None and not _is_number(v):
            raise BadRequest(f"{where}: feature {col.name!r} takes a number or null, got {type(v).__name__}")
        return v
    if col.kind == "id":
        if not _is_int(v):
            raise BadRequest(f"{where}: feature {col.name!r} takes one integer id, got {type(v).__name__}")
        return int(v)
    if col.kind == "float":
        if not _is_number(v):
            raise BadRequest(f"{where}: feature {col.name!r} takes a number, got {type(v).__name__}")
        return float(v)
    if not isinstance(v, (list, tuple)):
        raise BadRequest(f"{where}: feature {col.name!r} takes a list, got {type(v).__name__}")
    ok = {"ids": _is_int, "floats": _is_number, "cats": _is_cat}[col.kind]
    bad = [x for x in v if not ok(x)]
    if bad:
        what = {"ids": "integer ids", "floats": "numbers", "cats": "ids or strings"}[col.kind]
        raise BadRequest(f"{where}: feature {col.name!r} takes a list of {what}, "
                         f"got a {type(bad[0]).__name__}")
    if col.kind == "cats":
        return list(v)
    return [int(x) for x in v] if col.kind == "ids" else [float(x) for x in v]


# Exact-type checks that pass the common case (plain JSON values) column by column at C speed; anything
# else (numpy scalars, tuples, bad values) goes through _check_value, which converts or names the problem.
_FAST_OK: dict[str, Callable[[Any], bool]] = {
    "id": lambda x: type(x) is int,
    "float": lambda x: type(x) is float or type(x) is int,
    "cat": lambda x: type(x) is str or type(x) is int,
    "num": lambda x: x is None or type(x) is float or type(x) is int,
    "ids": lambda x: type(x) is list and all(type(e) is int for e in x),
    "floats": lambda x: type(x) is list and all(type(e) is float or type(e) is int for e in x),
    "cats": lambda x: type(x) is list and all(type(e) is str or type(e) is int for e in x),
}


class RequestEncoder:
    """Validates requests against one schema and turns them into the loader's Columns and Batches."""

    def __init__(self, schema: FeatureSchema, max_candidates: int = DEFAULT_MAX_CANDIDATES,
                 encoding: Mapping[str, Any] | None = None) -> None:
        self.schema = schema
        self.max_candidates = max_candidates
        self.arrow = arrow_schema(schema)
        self.table: Encoders | None = None
        self.text_columns: frozenset[str] = frozenset()
        if encoding is not None and encoding.get("kind") == TABLE:  # raw source values: the importer's
            self.table = encoders_from_json(dict(encoding))
            self.text_columns = frozenset(str(c) for c in encoding.get("text_columns") or ())
            self.columns = {k: _Column(k, kind) for k, kind in raw_columns(self.table).items()}
        else:  # raw values are the canonical ones (ids, as the simulator writes them)
            self.columns = request_columns(schema)

    def surface_index(self, value: Any) -> int:
        surfaces = list(self.schema.surfaces)
        if isinstance(value, str):
            if value not in surfaces:
                raise BadRequest(f"surface {value!r} is not one of {', '.join(surfaces)}")
            return surfaces.index(value)
        if _is_int(value):
            if not 0 <= int(value) < len(surfaces):
                raise BadRequest(f"surface {value} is out of range [0, {len(surfaces)})")
            return int(value)
        raise BadRequest(f"surface must be a name or an index, got {type(value).__name__}")

    def columns_of(self, request: Any) -> Columns:
        """One request -> checked Columns (one row per candidate), or a BadRequest."""
        if not isinstance(request, Mapping):
            raise BadRequest(f"a request is a JSON object, got {type(request).__name__}")
        extra = [k for k in request if k not in REQUEST_KEYS]
        if extra:
            raise BadRequest(f"unknown request key {extra[0]!r} (a request has {', '.join(REQUEST_KEYS)})")
        if "surface" not in request:
            raise BadRequest("missing 'surface' (a name such as "
                             f"{self.schema.surfaces[0]!r} or its index)")
        surface = self.surface_index(request["surface"])
        context = request.get("context", {})
        if not isinstance(context, Mapping):
            raise BadRequest(f"'context' must be an object of features, got {type(context).__name__}")
        cands = request.get("candidates")
        if not isinstance(cands, list):
            raise BadRequest("'candidates' must be a list of objects, one per ad to score")
        n = len(cands)
        if n == 0:
            raise BadRequest("'candidates' is empty: nothing to score")
        if n > self.max_candidates:
            raise BadRequest(f"too many candidates: {n} (at most {self.max_candidates} per request)")
        values: dict[str, list[Any]] = {}
        for k, v in context.items():
            col = self._column(k, "context")
            values[k] = [_check_value(col, v, "context")] * n
        if not all(type(c) is dict for c in cands):
            for i, c in enumerate(cands):
                if not isinstance(c, Mapping):
                    raise BadRequest(f"candidate {i}: must be an object of features, got {type(c).__name__}")
        wanted = [k for k in self.columns if k not in context]
        allowed = set(wanted)
        if not all(c.keys() <= allowed for c in cands):  # the slow path names the key
            for i, c in enumerate(cands):
                for k in c:
                    if k not in allowed:
                        self._column(k, f"candidate {i}")  # an unknown feature raises here
                        raise BadRequest(f"candidate {i}: feature {k!r} is also in the context; give it once")
        for name in wanted:
            col = self.columns[name]
            vals = values[name] = [c.get(name, _ABSENT) for c in cands]
            if all(v is _ABSENT for v in vals):
                raise BadRequest(f"missing feature {name!r} (give it in the context or in every candidate)")
            if not all(map(_FAST_OK[col.kind], vals)):  # the slow path names the first bad candidate
                for i, v in enumerate(vals):
                    if v is _ABSENT:
                        raise BadRequest(f"candidate {i}: missing feature {name!r}")
                    vals[i] = _check_value(col, v, f"candidate {i}")
        return self._check(values, surface, n)

    def _column(self, name: Any, where: str) -> _Column:
        col = self.columns.get(name) if isinstance(name, str) else None
        if col is None:
            raise BadRequest(f"{where}: unknown feature {name!r} (schema {self.schema.name!r})")
        return col

    def _check(self, values: dict[str, list[Any]], surface: int, n: int) -> Columns:
        """Raw values -> a canonical table (the importer's encoders, when the dataset was converted) ->
        the loader's checks."""
        if self.table is None:
            return self._checked(self._canonical(values, surface, n), n)
        try:
            raw = raw_batch(self.table, values, self.schema.surfaces[surface], n, self.text_columns)
            table = encode_raw(self.table, raw, self.schema, REQUEST)
            for t in self.schema.tasks:  # labels are not observed at serving time
                i = table.schema.get_field_index(t.label_column)
                table = table.set_column(i, table.schema.field(i), pa.nulls(n, table.schema.field(i).type))
        except (AdapterError, pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
            raise BadRequest(f"cannot encode the request's values: {str(e).splitlines()[0]}") from None
        return self._checked(table, n)

    def _canonical(self, values: dict[str, list[Any]], surface: int, n: int) -> pa.Table:
        sch = self.schema
        data: dict[str, pa.Array] = {
            sch.example_id_column: pa.array(np.arange(n, dtype=np.int64)),
            sch.time_column: pa.array(np.zeros(n, dtype=np.int64)),
            sch.surface_column: pa.array(np.full(n, surface, dtype=np.int32)),
        }
        for f in self.arrow:
            if f.name in values:
                try:
                    data[f.name] = pa.array(values[f.name], type=f.type)
                except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
                    raise BadRequest(f"feature {f.name!r}: {str(e).splitlines()[0]}") from None
            elif f.name not in data:  # labels: not observed
                data[f.name] = pa.nulls(n, type=f.type)
        return pa.table(data)

    def _checked(self, table: pa.Table, n: int) -> Columns:
        """The loader's path from a canonical table to checked Columns."""
        sch = self.schema
        log = ProblemLog(raise_errors=True)
        try:
            cols = Columns.from_arrow(conform_table(table, sch, REQUEST, check_nulls=False), sch)
            checked = check_columns(cols, sch, REQUEST, log)
        except DataError as e:
            where = f"candidate {e.row}: " if e.row is not None else ""
            raise BadRequest(f"{where}feature {e.column!r}: {e.what}") from None
        if checked.n != n:
            kept = set(checked.rows.tolist())
            first = next(i for i in range(n) if i not in kept)
            why = next((p for p in log.samples if p.row == first), None)
            reason = f"feature {why.column!r}: {why.what}" if why else "the schema skips it"
            raise BadRequest(f"candidate {first}: {reason} (the schema would skip this row; fix the value)")
        return checked

    def batch(self, requests: list[Any]) -> tuple[Batch, list[int]]:
        """Many requests -> one Batch (rows in request order) and each request's number of candidates;
        a bad request is a BadRequest naming its index."""
        parts = []
        for i, r in enumerate(requests):
            try:
                parts.append(self.columns_of(r))
            except BadRequest as e:
                raise BadRequest(f"request {i}: {e}" if len(requests) > 1 else str(e)) from None
        if not parts:
            raise BadRequest("no requests to score")
        return to_batch(Columns.concat(parts), self.schema), [p.n for p in parts]
