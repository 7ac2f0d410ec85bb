"""Arrow IPC request and reply bodies (Content-Type ``application/vnd.apache.arrow.stream``).

Layout of a request: one Arrow IPC *stream* whose record batches (usually one) hold the candidates, one
row per candidate ad and one column per candidate feature, typed as in the canonical Parquet (int64 ids,
float dense values, list<int64> for multi-valued and sequence fields). A null cell means "not given" and is
dropped, as an absent key is in JSON. The request-level fields ride in the schema metadata, as UTF-8:

- ``surface``: the surface name (``feed``) or its index (``0``);
- ``context``: a JSON object of the user-context features, ``{"user_id": 17, ...}`` (optional);
- ``ts``: the request time, a decimal integer in the schema's ``time_unit`` since the Unix epoch
  (optional; absent, the server's clock is the request time, exactly as for a JSON body without ``ts``).

The request time rides in the metadata rather than as a column because it is one value per request, as
``ts`` is one key of a JSON request: the two bodies carry the same fields in the same places.

A reply to an Arrow request that accepts Arrow (``Accept: application/vnd.apache.arrow.stream``) is one
stream with one float64 column per task, one row per candidate in request order, and ``version`` in the
schema metadata; otherwise the reply is the JSON ``{"version", "scores"}`` object.

Why Arrow at all: at 512 candidates a JSON body is parsed value by value in Python, while an Arrow body
arrives as columns; the decode cost per candidate is what a ranking service pays on every request.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pyarrow as pa

from opengem.serve.errors import BadRequest

ARROW_STREAM = "application/vnd.apache.arrow.stream"
_INTEGER = re.compile(r"-?[0-9]{1,20}")  # int64's range is checked later; this bounds int()'s work


def decode_request(body: bytes, tables: bool = False) -> dict[str, Any]:
    """An Arrow IPC stream body -> the request dict the Predictor takes; BadRequest when malformed.

    ``tables=True`` keeps the candidates as the ``pyarrow.Table`` itself (the Predictor takes it column
    by column, without building a Python dict per candidate: the point of an Arrow body); otherwise
    they are ``{feature: value}`` rows, null cells dropped, as a JSON body would give them."""
    try:
        reader = pa.ipc.open_stream(pa.BufferReader(body))
        table = reader.read_all()
    except (pa.ArrowException, ValueError, OSError) as e:
        raise BadRequest(f"body is not an Arrow IPC stream ({type(e).__name__}: {_short(e)})") from None
    meta = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
            for k, v in (table.schema.metadata or {}).items()}
    request: dict[str, Any] = {"candidates": table if tables else arrow_rows(table)}
    if "surface" in meta:
        s = meta["surface"]
        request["surface"] = int(s) if _INTEGER.fullmatch(s) else s
    if "context" in meta:
        try:
            context = json.loads(meta["context"])
        except json.JSONDecodeError as e:
            raise BadRequest(f"Arrow schema metadata 'context' is not JSON ({e})") from None
        request["context"] = context
    if "ts" in meta:
        request["ts"] = _request_ts(meta["ts"])
    return request


def _request_ts(text: str) -> int:
    """The metadata's ``ts`` as an int; the Predictor checks its range, as for a JSON ``ts``."""
    digits = text.strip()
    if not _INTEGER.fullmatch(digits):
        raise BadRequest(f"Arrow schema metadata 'ts' must be an integer time, got {_short(text)!r}")
    return int(digits)


def arrow_rows(table: pa.Table) -> list[dict[str, Any]]:
    """Candidate rows with nulls dropped: a null cell is a feature not given."""
    try:
        rows = table.to_pylist()
    except (pa.ArrowException, ValueError) as e:  # types Python cannot hold (e.g. a bad extension type)
        raise BadRequest(f"Arrow columns cannot be read ({_short(e)})") from None
    return [{k: v for k, v in row.items() if v is not None} for row in rows]


def encode_request(request: dict[str, Any]) -> bytes:
    """A request dict -> an Arrow IPC stream body (clients, the benchmark and the tests use this)."""
    table = pa.Table.from_pylist(list(request["candidates"]))
    meta = {}
    if "surface" in request:
        meta["surface"] = str(request["surface"])
    if "context" in request:
        meta["context"] = json.dumps(request["context"])
    if "ts" in request:
        meta["ts"] = str(request["ts"])
    table = table.replace_schema_metadata(meta)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def encode_reply(reply: dict[str, Any]) -> bytes:
    """A reply dict -> one Arrow stream: a float64 column per task, ``version`` in the metadata."""
    scores = reply["scores"]
    table = pa.table({task: pa.array(v, type=pa.float64()) for task, v in scores.items()})
    table = table.replace_schema_metadata({"version": str(reply.get("version", ""))})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def decode_reply(body: bytes) -> dict[str, Any]:
    """An Arrow reply body -> ``{"version", "scores"}``, as the JSON reply would be."""
    table = pa.ipc.open_stream(pa.BufferReader(body)).read_all()
    version = (table.schema.metadata or {}).get(b"version", b"").decode()
    return {"version": version, "scores": {n: table.column(n).to_pylist() for n in table.column_names}}


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:200]
