"""The importer's encoders (``opengem convert table``) in an artifact, and raw source rows through them.

A converted dataset's canonical ids come from :class:`~opengem.data.adapters.table_encode.Encoders`: the
vocabularies fitted on the train rows (0 = out of vocabulary), hashing for big columns, the dense
standardisation statistics, surfaces by name. Serving raw values therefore calls the *same*
``Encoders.encode`` on the request's rows (then the loader's checks, see :mod:`opengem.serve.encode`), so
a served row becomes exactly the ids and normalised values its converted twin holds.

The importer writes its encoders into the dataset folder (``encoders.json`` + ``_encoders/*.parquet``,
:mod:`opengem.data.adapters.encoders_io`, the one (de)serialisation); ``opengem export`` carries them
into the artifact as ``encoding.json`` (kind ``table``) plus the same vocabulary files, each digested in
the manifest. In memory the encoding is that dict with each vocabulary's values (an Arrow array, or a
list in the inline form :func:`encoders_to_json` gives a Python caller).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from opengem.data.adapters.common import AdapterError
from opengem.data.adapters.encoders_io import KIND, encoders_from_dict, encoders_to_dict
from opengem.data.adapters.table_encode import Chunk, Encoders, RowPlace, gather_spread_histories
from opengem.data.adapters.vocab import split_cells
from opengem.serve.errors import ArtifactError, BadRequest

TABLE = KIND


def encoders_to_json(enc: Encoders) -> dict[str, Any]:
    """The importer's encoders as a JSON-able encoding (vocab values inline as lists, exact order and
    float sums); an artifact written from it stores the values as Parquet files all the same."""
    d = encoders_to_dict(enc)
    for v in d["vocabs"].values():
        v["values"] = None if v["values"] is None else v["values"].to_pylist()
    return d


def encoders_from_json(d: dict[str, Any]) -> Encoders:
    """``Encoders`` from an artifact's encoding (values inline or already read from its files)."""
    try:
        return encoders_from_dict(d, "artifact encoding.json")
    except AdapterError as e:
        raise ArtifactError(str(e)) from None


def raw_columns(enc: Encoders) -> dict[str, str]:
    """Source column -> kind of raw value a request gives: "cat" (id or string), "cats" (list of them),
    "num" (number, or null = missing)."""
    cols = {s.name: "cats" if s.multi_valued else "cat" for s in enc.spec.sparse}
    cols.update({d.name: "num" for d in enc.spec.dense})
    for q in enc.spec.sequence:  # a history the log spreads over columns: one event a column, as logged
        cols.update({c: "cat" for c in q.columns} if q.columns else {q.name: "cats"})
    return cols


def raw_separators(enc: Encoders) -> dict[str, str]:
    """Source column -> the separator its cells join a list with (the spec's ``separator``): a request may
    give such a value as the log holds it ("12^7^5") or as a list."""
    return {s.name: s.separator for s in [*enc.spec.sparse, *enc.spec.sequence] if s.separator}


def _read_as_text(enc: Encoders, name: str, text_columns: frozenset[str]) -> bool:
    vocab = enc.vocabs.get(name)
    return name in text_columns or (
        vocab is not None and vocab.values is not None and pa.types.is_string(vocab.values.type))


def split_joined(rows: list[Any], sep: str, name: str, share: str, as_int: bool) -> list[Any]:
    """``rows`` of column ``name`` whose cells join a list with ``sep``, each joined cell ("12^7^5") split
    as the importer splits it (each value trimmed, empty ones dropped) and typed as it types them: integers
    (``as_int``: a history sharing the integer feature ``share``'s vocabulary), else text. Lists stay
    lists."""
    joined = [i for i, r in enumerate(rows) if isinstance(r, str)]
    if not joined:
        return rows
    out = list(rows)
    cells = split_cells(pa.array([rows[i] for i in joined], pa.string()), sep).to_pylist()
    for i, cell in zip(joined, cells):
        out[i] = [_integer(x, name, share, i) for x in cell] if as_int else cell
    return out


def _integer(token: str, name: str, share: str, row: int) -> int:
    try:
        return int(token)
    except ValueError:
        raise BadRequest(f"feature {name!r}: {token!r} in a joined cell (candidate {row}) is not an integer, "
                         f"as the values of {share!r}, whose vocabulary it shares, are") from None


def raw_batch(enc: Encoders, values: dict[str, list[Any]], surface: str, n: int,
              text_columns: frozenset[str] = frozenset()) -> pa.RecordBatch:
    """The request's raw rows as a source RecordBatch in the importer's column types: categorical values
    as the vocabulary keeps them (text-read sources keep strings; ``text_columns``: columns the sources
    held as text, so that a hashed one hashes a raw number's text as the importer did), joined cells
    split (:func:`split_joined`), numbers as float64, labels unobserved. A history the log spreads over
    columns comes as those columns (gathered here, as the importer gathers them) or as one list under its
    name (its events, oldest first)."""
    cols: dict[str, pa.Array] = {}
    joined = raw_separators(enc)
    shares = {q.name: q.share for q in enc.spec.sequence if q.share}
    history_of = {c: q.name for q in enc.spec.sequence for c in q.columns}  # a spread history's columns
    kinds = raw_columns(enc)
    for q in enc.spec.sequence:
        if q.columns and q.name in values:  # a spread history given as one list of its events
            for c in q.columns:
                del kinds[c]
            kinds[q.name] = "cats"
    for name, kind in kinds.items():
        v = values[name]
        # a history sharing a feature's vocabulary is read as that feature is (prepare_lists casts it)
        feature = history_of.get(name, name)  # a spread history's column is read as its history is
        share = shares.get(feature, "")
        as_text = _read_as_text(enc, share or feature, text_columns)
        if name in joined:
            v = split_joined(v, joined[name], name, share, bool(share) and not as_text)
        if kind == "num":
            cols[name] = pa.array(v, pa.float64())
        elif kind == "cat":
            cols[name] = pa.array([str(x) for x in v] if as_text else v, pa.string() if as_text else None)
        else:
            cols[name] = pa.array([[str(x) for x in row] for row in v] if as_text else v,
                                  pa.list_(pa.string()) if as_text else None)
    if enc.spec.surface:
        cols[enc.spec.surface] = pa.array([surface] * n, pa.string())
    gather_spread_histories(cols, enc.spec, "request")  # a type clash: BadRequest (encode.py)
    for rule in enc.spec.label_rules:
        cols.setdefault(rule.column, pa.nulls(n, pa.float64()))
    return pa.RecordBatch.from_pydict(cols)


def encode_raw(enc: Encoders, batch: pa.RecordBatch, schema: Any, source: str) -> pa.Table:
    """``Encoders.encode`` of the importer on the request's rows: canonical columns (ids, normalised)."""
    n = batch.num_rows
    rows = np.arange(n, dtype=np.int64)
    chunk = Chunk(source, batch, rows, np.zeros(n, np.int64), rows, np.zeros(n, np.int8),  # type: ignore[arg-type]
                  RowPlace(source, unit="candidate"))
    return enc.encode(chunk, schema)
