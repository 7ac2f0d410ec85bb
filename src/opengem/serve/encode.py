"""Raw request values -> the model's Batch, through the loader's own code path.

A request is ``{"surface": name | index, "context": {feature: value}, "candidates": [{feature: value}, ...]}``
(``surface`` may be left out where the model has one surface)
and optionally ``"ts"``, the request time (the server's clock when absent, :func:`with_request_ts`),
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

import functools
import itertools
import math
import numbers
import operator
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from opengem.data.adapters.common import AdapterError
from opengem.data.adapters.table_encode import FLOAT32_MAX, Encoders
from opengem.data.batch import Batch
from opengem.data.dataset import arrow_schema
from opengem.data.parquet import Columns, DataError, ProblemLog, check_columns, conform_table, to_batch
from opengem.data.schema import FeatureSchema
from opengem.data.time_features import TIME_UNITS
from opengem.serve.arrow_io import arrow_rows
from opengem.serve.errors import BadRequest
from opengem.serve.table_codec import (
    TABLE,
    encode_raw,
    encoders_from_json,
    raw_batch,
    raw_columns,
    raw_separators,
)

REQUEST = "request"  # the "file" named in the loader's problem messages
DEFAULT_MAX_CANDIDATES = 4096
REQUEST_KEYS = ("surface", "context", "candidates", "ts")
_REQUEST_KEY_SET = frozenset(REQUEST_KEYS)
_ABSENT = object()  # a feature a candidate did not give (None is a value: a missing number)


@dataclass(frozen=True)
class _Column:
    name: str
    kind: str  # "id" | "ids" | "float" | "floats"; raw source values: "cat" | "cats" (ids or strings), "num"
    max_len: int = 0  # sequences: the declared max_len (longer is the schema's on_overflow)
    separator: str = ""  # raw "cats": a joined cell ("12^7^5") is also a value (table_codec.split_joined)


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
        if v is None:
            return ""  # missing, as an empty cell (the importer's null: the out-of-vocabulary row)
        if not _is_cat(v):
            raise BadRequest(f"{where}: feature {col.name!r} takes one id or string, got {type(v).__name__}")
        return v
    if col.kind == "num":
        if v is not None and not _is_number(v):
            raise BadRequest(f"{where}: feature {col.name!r} takes a number or null, got {type(v).__name__}")
        return v if v is None else _in_float32_range(col, v, where)
    if col.kind == "id":
        if not _is_int(v):
            raise BadRequest(f"{where}: feature {col.name!r} takes one integer id, got {type(v).__name__}")
        return _int64(col, int(v), where)
    if col.kind == "float":
        if not _is_number(v):
            raise BadRequest(f"{where}: feature {col.name!r} takes a number, got {type(v).__name__}")
        return _in_float32_range(col, float(v), where)
    if col.separator and isinstance(v, str):
        return v  # raw_batch splits it as the importer does
    if not isinstance(v, (list, tuple)):
        joined = f" or a cell joined by {col.separator!r}" if col.separator else ""
        raise BadRequest(f"{where}: feature {col.name!r} takes a list{joined}, got {type(v).__name__}")
    ok = {"ids": _is_int, "floats": _is_number, "cats": _is_cat}[col.kind]
    bad = [x for x in v if not ok(x)]
    if bad:
        what = {"ids": "integer ids", "floats": "numbers", "cats": "ids or strings"}[col.kind]
        raise BadRequest(f"{where}: feature {col.name!r} takes a list of {what}, "
                         f"got a {type(bad[0]).__name__}")
    if col.kind == "cats":
        return list(v)
    if col.kind == "ids":
        return [_int64(col, int(x), where) for x in v]
    return [_in_float32_range(col, float(x), where) for x in v]


def _int64(col: _Column, v: int, where: str) -> int:
    """An id past int64 (the ids' type) is named as sent, not as pyarrow's 'int too large for C long'."""
    if not -(2**63) <= v < 2**63:
        raise BadRequest(f"{where}: feature {col.name!r}: id {v} is past the range of int64")
    return v


def _in_float32_range(col: _Column, v: Any, where: str) -> Any:
    """A finite number past float32's range (a dense feature's type) would become inf and be refused as
    "value inf": named as sent instead. NaN and inf stay what the schema's policy makes of them."""
    if math.isfinite(v) and abs(v) > FLOAT32_MAX:
        raise BadRequest(f"{where}: feature {col.name!r}: {v:g} is past the range of float32 "
                         f"(|x| <= {FLOAT32_MAX:.3g}), the type a dense feature is stored as")
    return v


# Raw source values (``opengem convert table`` data): the Python types each kind may have. A column passes
# when the set of its values' types (``map(type, ...)``, at C speed) is a subset; anything else (numpy
# scalars, tuples, a missing or bad value) goes through _check_value, which converts or names the problem.
_RAW_TYPES: dict[str, frozenset[type]] = {"cat": frozenset({int, str}),
                                          "num": frozenset({int, float, type(None)})}
_LIST_TYPES = frozenset({list})
_DICT_TYPES = {dict}
_INT64 = pa.int64()
_FLOAT32 = pa.float32()
_DOUBLE = pa.float64()
_NULL = pa.null()


def _raw_column_is_clean(kind: str, values: Sequence[Any]) -> bool:
    """True when every raw source value has exactly a type the kind takes (``type(True)`` is not int)."""
    if kind in _RAW_TYPES:
        return set(map(type, values)) <= _RAW_TYPES[kind]
    return (set(map(type, values)) <= _LIST_TYPES
            and set(map(type, itertools.chain.from_iterable(values))) <= _RAW_TYPES["cat"])


def fast_column(kind: str, values: Sequence[Any]) -> pa.Array | None:
    """One feature's JSON values -> an Arrow array of its canonical type, or None when any value is not
    plainly of the kind (the caller's slow path then names the candidate and the problem).

    pyarrow's type inference is the check, in one C pass over the values: a column of ids must infer as
    int64 (a float, a bool, a string, a list, a missing value or an id past int64 makes it infer otherwise
    or fail), dense values as int64 or double. List columns are flattened once and inferred the same
    way, with their lengths as the list offsets.
    """
    try:
        if kind == "id" or kind == "float":
            arr = pa.array(values)
            if arr.null_count:
                return None
            if arr.type == _INT64:
                return arr if kind == "id" else _finite_float32(arr)
            return _finite_float32(arr) if kind == "float" and arr.type == _DOUBLE else None
        if kind == "ids" or kind == "floats":
            if not set(map(type, values)) <= _LIST_TYPES:
                return None
            flat = pa.array(list(itertools.chain.from_iterable(values)))
            if flat.null_count:
                return None
            if kind == "ids" and flat.type == _INT64:
                pass  # already the canonical type: no cast kernel to call
            elif flat.type == _NULL or flat.type == _INT64:
                flat = flat.cast(_INT64 if kind == "ids" else _FLOAT32, safe=False)
            elif kind == "floats" and flat.type == _DOUBLE:
                flat = flat.cast(_FLOAT32, safe=False)
            else:
                return None
            offsets = np.zeros(len(values) + 1, dtype=np.int32)
            np.cumsum(np.fromiter(map(len, values), np.int32, len(values)), out=offsets[1:])
            return pa.ListArray.from_arrays(pa.array(offsets), flat)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        return None
    return None


def _finite_float32(arr: pa.Array) -> pa.Array | None:
    """``arr`` as float32; None (the slow path then names the candidate) where a finite value overflows."""
    out = arr.cast(_FLOAT32, safe=False)
    if pc.any(pc.is_inf(out)).as_py() and not pc.any(pc.is_inf(arr.cast(_DOUBLE))).as_py():
        return None
    return out


class RequestEncoder:
    """Validates requests against one schema and turns them into the loader's Columns and Batches."""

    def __init__(self, schema: FeatureSchema, max_candidates: int = DEFAULT_MAX_CANDIDATES,
                 encoding: Mapping[str, Any] | None = None) -> None:
        self.schema = schema
        self.max_candidates = max_candidates
        self.arrow = arrow_schema(schema)
        self.table: Encoders | None = None
        self.text_columns: frozenset[str] = frozenset()
        self.spread: dict[str, list[str]] = {}
        if encoding is not None and encoding.get("kind") == TABLE:  # raw source values: the importer's
            self.table = encoders_from_json(dict(encoding))
            self.text_columns = frozenset(str(c) for c in encoding.get("text_columns") or ())
            seps = raw_separators(self.table)
            self.columns = {k: _Column(k, kind, separator=seps.get(k, ""))
                            for k, kind in raw_columns(self.table).items()}
            # a history the log spreads over columns may also come as one list under its name
            self.spread = {q.name: list(q.columns) for q in self.table.spec.sequence if q.columns}
            self.columns.update({h: _Column(h, "cats") for h in self.spread})
        else:  # raw values are the canonical ones (ids, as the simulator writes them)
            self.columns = request_columns(schema)
        self._candidate_names = frozenset(self.columns)  # an Arrow body with all of them: _merged_arrow
        self._layout: tuple[pa.Schema, tuple[Any, ...],
                            tuple[pa.Schema, list[int | str | pa.DataType]] | None] | None = None

    def surface_index(self, value: Any) -> int:
        """The surface a request names (``None``: it names none, which only a one-surface model allows:
        a plain CTR table converted with ``convert table`` has the one surface ``all``)."""
        surfaces = list(self.schema.surfaces)
        if value is None:
            if len(surfaces) == 1:
                return 0
            raise BadRequest(f"missing 'surface' (a name such as {surfaces[0]!r} or its index)")
        if isinstance(value, str):
            if value not in surfaces:
                raise BadRequest(f"surface {value!r} is not one of {', '.join(surfaces)}")
            return surfaces.index(value)
        if _is_int(value):
            # surfaces named by numbers (a log's slot column, 1 and 2): the number a client replays from
            # the log is a name, which as an index would silently score another surface
            name = str(int(value))
            if name in surfaces and surfaces.index(name) != int(value):
                raise BadRequest(f"surface {value} is ambiguous: the surfaces are named "
                                 f"{', '.join(map(repr, surfaces))}; send the name as a string ({name!r})")
            if not 0 <= int(value) < len(surfaces):
                raise BadRequest(f"surface {value} is out of range [0, {len(surfaces)})")
            return int(value)
        raise BadRequest(f"surface must be a name or an index, got {type(value).__name__}")

    def columns_of(self, request: Any) -> Columns:
        """One request -> checked Columns (one row per candidate), or a BadRequest."""
        table = self._conformed(self.table_of(request))
        return self._checked(table, [table.num_rows])

    def table_of(self, request: Any) -> pa.Table:
        """One request -> its rows as a canonical Arrow table, before ``conform_table``, or a BadRequest.
        The loader's path runs on the table of a whole batch (:meth:`batch`).

        ``candidates`` is a list of ``{feature: value}`` objects (JSON) or a ``pyarrow.Table`` with one
        column per candidate feature (an Arrow IPC body, :func:`opengem.serve.arrow_io.decode_request`
        with ``tables=True``), which goes into the canonical table as columns, never through Python dicts.
        """
        if not isinstance(request, Mapping):
            raise BadRequest(f"a request is a JSON object, got {type(request).__name__}")
        extra = [k for k in request if k not in REQUEST_KEYS]
        if extra:
            raise BadRequest(f"unknown request key {extra[0]!r} (a request has {', '.join(REQUEST_KEYS)})")
        surface = self.surface_index(request.get("surface"))
        context = request.get("context", {})
        if not isinstance(context, Mapping):
            raise BadRequest(f"'context' must be an object of features, got {type(context).__name__}")
        cands = request.get("candidates")
        if isinstance(cands, pa.Table) and self.table is not None:
            cands = arrow_rows(cands)  # raw source values go through the importer's encoders as rows
        if not isinstance(cands, (list, pa.Table)):
            raise BadRequest("'candidates' must be a list of objects, one per ad to score")
        n = len(cands)
        if n == 0:
            raise BadRequest("'candidates' is empty: nothing to score")
        if n > self.max_candidates:
            raise BadRequest(f"too many candidates: {n} (at most {self.max_candidates} per request)")
        values: dict[str, list[Any] | pa.Array | _Repeated] = {}
        for k, v in context.items():
            col = self._column(k, "context")
            values[k] = _Repeated(_check_value(col, v, "context"), n)
        columns = self._wanted(context, cands)
        if isinstance(cands, pa.Table):
            values.update(self._arrow_values(cands, context, columns))
        else:
            values.update(self._json_values(cands, context, columns))
        return with_request_ts(self._canonical_table(values, surface, n), request, self.schema)

    def _wanted(self, context: Mapping[str, Any], cands: list[Any] | pa.Table) -> dict[str, _Column]:
        """The features this request must carry: a history the log spreads over columns comes either as
        those columns, as logged, or as one list of its events under its name, whichever the request (its
        context or its first candidate) uses."""
        if not self.spread:
            return self.columns
        if isinstance(cands, pa.Table):
            first: Any = cands.column_names
        else:
            first = cands[0] if isinstance(cands[0], Mapping) else {}
        given = set(context) | set(first)
        out = dict(self.columns)
        for history, columns in self.spread.items():
            if history in given:
                both = [c for c in columns if c in given]
                if both:
                    raise BadRequest(f"history {history!r} is given as a list and as its column {both[0]!r}: "
                                     f"give it one way (a list under {history!r}, or its columns as logged)")
                for c in columns:
                    del out[c]
            else:
                del out[history]
        return out

    def _history_of(self, feature: str) -> str:
        """The spread history ``feature`` is (its name) or is a column of."""
        return next((h for h, cols in self.spread.items() if feature == h or feature in cols), feature)

    def _json_values(self, cands: list[Any], context: Mapping[str, Any],
                     columns_wanted: dict[str, _Column]) -> dict[str, list[Any] | pa.Array]:
        """Candidate objects -> one checked column per feature. The common case (plain JSON values of the
        right types) is checked and converted per column at C speed (:func:`fast_column`; raw source
        values: a type-set check); the slow path names the first bad candidate."""
        if set(map(type, cands)) != _DICT_TYPES:
            for i, c in enumerate(cands):
                if not isinstance(c, Mapping):
                    raise BadRequest(f"candidate {i}: must be an object of features, got {type(c).__name__}")
        wanted = [k for k in columns_wanted if k not in context]
        allowed = frozenset(wanted)
        columns = _transpose(cands, wanted)
        # no candidate has a key beyond ``wanted`` when each has all of them (the transpose found them)
        # and no more (a set of lengths, at C speed: 10x cheaper than a subset test per candidate)
        exact = set(map(len, cands)) == {len(wanted)} and not (columns and columns[0] is None)
        if not exact and not all(map(allowed.issuperset, cands)):  # the slow path names the key
            for i, c in enumerate(cands):
                for k in c:
                    if k not in allowed:
                        self._column(k, f"candidate {i}")  # an unknown feature raises here
                        if k in context:
                            raise BadRequest(f"candidate {i}: feature {k!r} is also in the context; "
                                             "give it once")
                        raise BadRequest(f"candidate {i}: feature {k!r} gives {self._history_of(k)!r} in the "
                                         "other form than the context or candidate 0: give it one way")
        values: dict[str, list[Any] | pa.Array] = {}
        for name, vals in zip(wanted, columns, strict=True):
            col = columns_wanted[name]
            if vals is not None:
                if self.table is None:
                    arr = fast_column(col.kind, vals)
                    if arr is not None:
                        values[name] = arr
                        continue
                elif _raw_column_is_clean(col.kind, vals):
                    values[name] = list(vals)
                    continue
            vals = values[name] = [c.get(name, _ABSENT) for c in cands]
            if all(v is _ABSENT for v in vals):
                raise BadRequest(f"missing feature {name!r} (give it in the context or in every candidate)")
            for i, v in enumerate(vals):
                if v is _ABSENT:
                    raise BadRequest(f"candidate {i}: missing feature {name!r}")
                vals[i] = _check_value(col, v, f"candidate {i}")
        return values

    def _arrow_values(self, cands: pa.Table, context: Mapping[str, Any],
                      columns_wanted: dict[str, _Column]) -> dict[str, pa.Array]:
        """An Arrow table of candidates -> its columns as they are (``conform_table`` casts them and names
        a column of the wrong type). A column of nulls only is a feature not given, a null cell in a
        column with values a candidate that lacks it."""
        values: dict[str, pa.Array] = {}
        for name in cands.column_names:
            self._column(name, "candidates")  # an unknown feature raises here
            arr = cands.column(name)
            if arr.null_count == len(arr):
                continue
            if name in context:
                raise BadRequest(f"feature {name!r} is in the context and in the candidates; give it once")
            if arr.null_count:
                first = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
                raise BadRequest(f"candidate {first}: missing feature {name!r}")
            if pa.types.is_list(arr.type) and pa.types.is_null(arr.type.value_type):  # every list empty
                arr = pa.array([[]] * len(arr), type=self.arrow.field(name).type)
            values[name] = arr
        for name in columns_wanted:
            if name not in values and name not in context:
                raise BadRequest(f"missing feature {name!r} (give it in the context or in every candidate)")
        return values

    def _column(self, name: Any, where: str) -> _Column:
        col = self.columns.get(name) if isinstance(name, str) else None
        if col is None:
            raise BadRequest(f"{where}: unknown feature {name!r} (schema {self.schema.name!r})")
        return col

    def _canonical_table(self, values: dict[str, Any], surface: int, n: int) -> pa.Table:
        """Checked values -> a canonical table (through the importer's encoders when the dataset was
        converted)."""
        if self.table is None:
            return self._canonical(values, surface, n)
        values = {k: v.as_list() if isinstance(v, _Repeated) else v for k, v in values.items()}
        try:
            raw = raw_batch(self.table, values, self.schema.surfaces[surface], n, self.text_columns)
            table = encode_raw(self.table, raw, self.schema, REQUEST)
            for t in self.schema.tasks:  # labels are not observed at serving time
                i = table.schema.get_field_index(t.label_column)
                table = table.set_column(i, table.schema.field(i), pa.nulls(n, table.schema.field(i).type))
        except (AdapterError, pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
            raise BadRequest(f"cannot encode the request's values: {str(e).splitlines()[0]}") from None
        return table

    def _conformed(self, table: pa.Table) -> pa.Table:
        """The loader's ``conform_table``: canonical types, or the column that has the wrong one."""
        try:
            return conform_table(table, self.schema, REQUEST, target=self.arrow, check_nulls=False)
        except DataError as e:
            raise BadRequest(f"feature {e.column!r}: {e.what}") from None

    def _canonical(self, values: dict[str, Any], surface: int, n: int) -> pa.Table:
        sch = self.schema
        example_id, ts, surfaces = _bookkeeping(n, surface)
        data: dict[str, pa.Array] = {sch.example_id_column: example_id, sch.time_column: ts,
                                     sch.surface_column: surfaces}
        for f in self.arrow:
            if f.name in values:
                v = values[f.name]
                if isinstance(v, (pa.Array, pa.ChunkedArray)):  # an Arrow column: conform_table casts it
                    data[f.name] = v
                    continue
                try:
                    data[f.name] = _broadcast(v.value, f.type, n) if isinstance(v, _Repeated) else \
                        pa.array(v, type=f.type)
                except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
                    raise BadRequest(f"feature {f.name!r}: {str(e).splitlines()[0]}") from None
            elif f.name not in data:  # labels: not observed
                data[f.name] = _nulls(n, f.type)
        return pa.table(data)

    def _checked(self, table: pa.Table, counts: list[int]) -> Columns:
        """The loader's path from a conformed table (``counts[i]`` rows of request ``i``) to checked
        Columns: ``Columns.from_arrow`` -> ``check_columns``, once for a whole batch.

        The problem log keeps no samples (``keep=0``): building one per repaired value (a VM schema
        hashes every id past its cap, so most requests have some) cost more than the rest of the checks.
        Only when a row was skipped are the checks run again with samples, to say why."""
        sch = self.schema
        try:
            cols = Columns.from_arrow(table, sch)
            checked = check_columns(cols, sch, REQUEST, ProblemLog(raise_errors=True, keep=0))
        except DataError as e:
            raise BadRequest(f"{_where(e.row, counts)}feature {e.column!r}: {e.what}") from None
        if checked.n != cols.n:
            log = ProblemLog(raise_errors=True)
            check_columns(cols, sch, REQUEST, log)
            kept = set(checked.rows.tolist())
            first = next(i for i in range(cols.n) if i not in kept)
            why = next((p for p in log.samples if p.row == first), None)
            reason = f"feature {why.column!r}: {why.what}" if why else "the schema skips it"
            raise BadRequest(f"{_where(first, counts)}{reason} (the schema would skip this row; fix the "
                             "value)")
        return checked

    def batch(self, requests: list[Any]) -> tuple[Batch, list[int]]:
        """Many requests -> one Batch (rows in request order) and each request's number of candidates;
        a bad request is a BadRequest naming its index. Each request is checked and made a table on its
        own, then ``conform_table``, the loader's row checks and batching run once over all of them (their
        cost is mostly per call, not per row: once per forward pass, not once per request)."""
        if not requests:
            raise BadRequest("no requests to score")
        merged = self._merged_arrow(requests)
        if merged is not None:
            table, counts = merged
            return to_batch(self._checked(self._conformed(table), counts), self.schema), counts
        tables = []
        for i, r in enumerate(requests):
            try:
                tables.append(self.table_of(r))
            except BadRequest as e:
                raise BadRequest(f"request {i}: {e}" if len(requests) > 1 else str(e)) from None
        counts = [t.num_rows for t in tables]
        return to_batch(self._checked(self._conformed_all(tables), counts), self.schema), counts

    def _merged_arrow(self, requests: list[Any]) -> tuple[pa.Table, list[int]] | None:
        """Arrow-body requests -> ONE canonical table over all their candidates, or None when this fast
        path does not apply (then :meth:`table_of` runs per request and names any problem).

        Why: per request, :meth:`table_of` looked up each column, counted its nulls and built a canonical
        table (~0.19 ms for 16 columns), 3 ms of a 16-request batch. When every request sends the same
        Arrow schema, context features under the same names and between them every feature, and no null
        (what a client that builds its bodies one way always does), the column checks hold for all
        requests at once: the candidate tables are concatenated (zero-copy, one chunk per request), checked
        once; each context value is checked and broadcast to its request's candidates (one Arrow value
        repeated by a ``take``), and the bookkeeping columns (example_id, ts, surface: shared cached arrays)
        are per request. ``conform_table`` and the loader's row checks then run once on the merged table as
        on any other, naming ``request i: candidate j``. A ranking request is one user's context and N
        ads: without the context here, such requests took :meth:`table_of` one by one (5x the encode of
        16 merged requests of 512 candidates)."""
        if self.table is not None:
            return None  # raw source values: the importer's encoders take them row by row
        first = None
        context_names: tuple[Any, ...] | None = None  # the context's features, the same in every request
        parts: list[tuple[int, int, int | None]] = []  # (candidates, surface, ts) per request
        contexts: list[Mapping[str, Any]] = []
        for r in requests:
            if not isinstance(r, dict) or not set(r) <= _REQUEST_KEY_SET:
                return None
            context = r.get("context", {})
            if not isinstance(context, Mapping):
                return None
            names = tuple(context)
            if context_names is None:
                context_names = names
            elif names != context_names:
                return None
            contexts.append(context)
            cands = r.get("candidates")
            if not isinstance(cands, pa.Table) or not 0 < cands.num_rows <= self.max_candidates:
                return None
            if first is None:
                first = cands.schema
            elif cands.schema is not first and not cands.schema.equals(first):
                return None
            try:
                surface, ts = self.surface_index(r.get("surface")), request_ts(r, self.schema)
            except BadRequest:
                return None
            parts.append((cands.num_rows, surface, ts))
        layout = self._merged_layout(first, context_names or ()) if first is not None else None
        if layout is None:
            return None  # a feature missing, unknown or given twice: the slow path says which
        merged_schema, sources = layout
        if len(requests) == 1:  # (one chunk per column, as it came: no concatenation to pay for)
            cands = requests[0]["candidates"]
        else:
            cands = pa.concat_tables([r["candidates"] for r in requests])
        columns = cands.columns
        if any(col.null_count for col in columns):
            return None
        counts = [n for n, _, _ in parts]
        books = [_bookkeeping(n, s) for n, s, _ in parts]
        ts = [b[1] if t is None else pa.array(np.full(n, t, dtype=np.int64))
              for b, (n, _, t) in zip(books, parts, strict=True)]
        total = sum(counts)
        if len(requests) == 1:
            arrays: list[pa.Array | pa.ChunkedArray] = [books[0][0], ts[0], books[0][2]]
        else:
            arrays = [pa.chunked_array([b[0] for b in books]), pa.chunked_array(ts),
                      pa.chunked_array([b[2] for b in books])]
        for source in sources:
            if isinstance(source, int):
                arrays.append(columns[source])
            elif isinstance(source, str):  # a context feature: each request's value for its candidates
                column = self._broadcast_context(source, contexts, counts)
                if column is None:
                    return None  # a bad value: the slow path names it
                arrays.append(column)
            else:
                arrays.append(_nulls(total, source))
        return pa.Table.from_arrays(arrays, schema=merged_schema), counts

    def _broadcast_context(self, name: str, contexts: list[Mapping[str, Any]], counts: list[int]
                           ) -> pa.Array | None:
        """Context feature ``name`` of each request, checked and repeated for its candidates (one ``take``
        over all the requests), in the canonical type; None when a value is not of the feature's kind."""
        col, type_ = self.columns[name], self.arrow.field(name).type
        try:
            values = pa.array([_check_value(col, c[name], "context") for c in contexts], type=type_)
        except (BadRequest, pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
            return None
        if len(counts) == 1:
            return values.take(_zero_rows(counts[0]))
        return values.take(pa.array(np.repeat(np.arange(len(counts), dtype=np.int32), counts)))

    def _merged_layout(self, cands: pa.Schema, context: tuple[Any, ...] = ()
                       ) -> tuple[pa.Schema, list[int | str | pa.DataType]] | None:
        """For an Arrow body's candidate schema and the features of its context: the merged table's schema
        (the bookkeeping columns, then the canonical columns in order, each candidate column with the type
        it came with, each context feature in its canonical type) and, per canonical column after the
        bookkeeping ones, the index of its candidate column, the name of its context feature or the type
        of its nulls (labels); None when the two together lack a feature, have an unknown one or one
        twice, or a candidate column's lists are all empty (``list<null>``, which :meth:`_arrow_values`
        retypes).

        Why cached (the last schema seen): a client builds its bodies one way, so every request has the
        same schema, and working this out (name lookups, a schema of 13 fields) cost ~0.15 ms of a
        request's ~2.2 ms encode; comparing two schemas is one C call."""
        last = self._layout
        if last is not None and last[1] == context and (last[0] is cands or last[0].equals(cands)):
            return last[2]
        names = cands.names
        layout = None
        given = set(names) | set(context)
        if len(names) + len(context) == len(self._candidate_names) and given == self._candidate_names \
                and not any(pa.types.is_list(t) and pa.types.is_null(t.value_type) for t in cands.types):
            sch = self.schema
            bookkeeping = (sch.example_id_column, sch.time_column, sch.surface_column)
            fields = [self.arrow.field(name) for name in bookkeeping]
            sources: list[int | str | pa.DataType] = []
            in_context = set(context)
            for f in self.arrow:
                if f.name in in_context:
                    fields.append(pa.field(f.name, f.type))
                    sources.append(f.name)
                elif f.name in self._candidate_names:
                    i = cands.get_field_index(f.name)
                    fields.append(pa.field(f.name, cands.field(i).type))
                    sources.append(i)
                elif f.name not in bookkeeping:
                    fields.append(pa.field(f.name, f.type))  # labels: not observed
                    sources.append(f.type)
            layout = (pa.schema(fields), sources)
        self._layout = (cands, context, layout)
        return layout

    def _conformed_all(self, tables: list[pa.Table]) -> pa.Table:
        """``conform_table`` once over the requests' tables when they have the same Arrow schema (the
        common case: JSON requests always do), else per request; a refusal names the request."""
        if len(tables) == 1:
            return self._conformed(tables[0])
        first = tables[0].schema
        if all(t.schema.equals(first) for t in tables[1:]):
            try:
                return self._conformed(pa.concat_tables(tables))
            except BadRequest:
                pass  # conform each below, to name the request
        conformed = []
        for i, t in enumerate(tables):
            try:
                conformed.append(self._conformed(t))
            except BadRequest as e:
                raise BadRequest(f"request {i}: {e}") from None
        return pa.concat_tables(conformed)


def with_request_ts(table: pa.Table, request: Mapping[str, Any], schema: FeatureSchema) -> pa.Table:
    """``table`` with the request's time in the time column: its ``ts`` (an integer in the schema's
    ``time_unit`` since the Unix epoch), else the server's clock now when the schema derives time features
    from it (issue 14: the hour of the day), else unchanged (ts 0: nothing reads it)."""
    ts = request_ts(request, schema)
    if ts is None:
        return table
    i = table.schema.get_field_index(schema.time_column)
    return table.set_column(i, table.schema.field(i), pa.array(np.full(table.num_rows, ts, dtype=np.int64)))


def request_ts(request: Mapping[str, Any], schema: FeatureSchema) -> int | None:
    """The request's time for the time column (see :func:`with_request_ts`), or None to leave it 0."""
    if "ts" in request:
        ts = request["ts"]
        if not _is_int(ts) or not -(2**63) <= ts < 2**63:
            raise BadRequest(f"'ts' must be an integer time ({schema.time_unit} since the Unix epoch), "
                             f"got {ts!r}")
        return int(ts)
    if schema.time_features:
        return time.time_ns() // (1_000_000_000 // TIME_UNITS[schema.time_unit])
    return None


@functools.lru_cache(maxsize=64)
def _bookkeeping(n: int, surface: int) -> tuple[pa.Array, pa.Array, pa.Array]:
    """The example_id (0..n-1), ts (0) and surface columns of an n-row request. Arrow arrays are
    immutable, so one set per (n, surface) is shared by every request of that size (and the loader's
    path only reads them): three array builds less per request."""
    return (pa.array(np.arange(n, dtype=np.int64)), pa.array(np.zeros(n, dtype=np.int64)),
            pa.array(np.full(n, surface, dtype=np.int32)))


@dataclass(frozen=True)
class _Repeated:
    """A context value: the same for each of a request's n candidates. It becomes one Arrow value repeated
    by a ``take`` (:func:`_broadcast`), not a Python list of n references that pyarrow converts one by one
    (0.8 ms of a 512-candidate request whose context holds a user's histories)."""

    value: Any
    n: int

    def as_list(self) -> list[Any]:
        return [self.value] * self.n


def _broadcast(value: Any, type_: pa.DataType, n: int) -> pa.Array:
    """``value`` (a checked feature value) as an n-row Arrow array of ``type_``."""
    return pa.array([value], type=type_).take(_zero_rows(n))


@functools.lru_cache(maxsize=64)
def _zero_rows(n: int) -> pa.Array:
    return pa.array(np.zeros(n, dtype=np.int32))


@functools.lru_cache(maxsize=64)
def _nulls(n: int, type_: pa.DataType) -> pa.Array:
    """n nulls of a type (labels: not observed at serving time), shared like :func:`_bookkeeping`."""
    return pa.nulls(n, type=type_)


def _transpose(cands: list[dict[str, Any]], names: list[str]) -> list[tuple[Any, ...] | None]:
    """Candidate objects -> one tuple of values per feature, in C (``itemgetter`` + ``zip``); all None
    when some candidate lacks a feature (the caller's slow path says which)."""
    if not names:
        return []
    try:
        if len(names) == 1:
            return [tuple(map(operator.itemgetter(names[0]), cands))]
        return list(zip(*map(operator.itemgetter(*names), cands), strict=True))
    except KeyError:
        return [None] * len(names)


def _where(row: int | None, counts: list[int]) -> str:
    """``"candidate j: "`` (``"request i: candidate j: "`` in a batch of several) for a row of a batch."""
    if row is None:
        return ""
    i = int(np.searchsorted(np.cumsum(counts), row, side="right"))
    candidate = row - sum(counts[:i])
    return f"request {i}: candidate {candidate}: " if len(counts) > 1 else f"candidate {candidate}: "
