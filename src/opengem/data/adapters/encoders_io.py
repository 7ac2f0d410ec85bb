"""The importer's fitted encoders on disk: ``encoders.json`` plus one Parquet file per vocabulary.

``opengem convert table`` fits :class:`~opengem.data.adapters.table_encode.Encoders` (vocabularies, dense
statistics, surfaces) and writes them into the dataset folder at conversion time, so that a model trained
on the dataset can later be served on *raw* source values through the same ``Encoders.encode`` (see
docs/SERVING.md). Layout, in the dataset folder and again in an export artifact:

- ``encoders.json``: the import spec, the surfaces, each dense statistic (exact float sums), the
  categorical columns the sources held as text (``text_columns``: a hashed one hashes the text) and, per
  vocabulary, its size, hashed/fixed flags, the kind of its values (``int``/``str``), how many it keeps,
  and the file holding them with that file's sha256;
- ``_encoders/<feature>.parquet``: one column ``value``, the kept values in id order (id = row + 1).

Why Parquet and not JSON lists: a vocabulary can hold millions of values (JSON would be slow and large).
Why no pickle: these files travel between machines and into a server; only plain Arrow data is read, and a
file whose digest, type or length differs from the record is refused. The folder name starts with ``_`` so
that a dataset does not mistake it for a partition.

In memory the encoders are a dict (``encoders_to_dict``) whose ``values`` are Arrow arrays (or plain lists
in the older inline form); :func:`encoders_from_dict` turns either back into ``Encoders``.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from opengem.data.adapters.common import AdapterError
from opengem.data.adapters.infer import spec_from_dict
from opengem.data.adapters.table_encode import Encoders
from opengem.data.adapters.vocab import CategoryVocab, DenseStats

KIND = "table"
ENCODERS_FILE = "encoders.json"
VOCAB_DIR = "_encoders"  # '_': not a partition of the dataset folder (see opengem.data.dataset)
VALUE_COLUMN = "value"
FORMAT_VERSION = 1
VOCAB_FILE = re.compile(rf"{VOCAB_DIR}/[A-Za-z0-9][A-Za-z0-9_.-]*\.parquet")
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,100}")
_TYPES = {"int": pa.int64(), "str": pa.string()}


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def encoders_to_dict(enc: Encoders) -> dict[str, Any]:
    """The encoders in memory as plain data: vocab values stay Arrow arrays (exact order, no copy)."""
    vocabs = {}
    for name, v in enc.vocabs.items():
        kind = None if v.values is None else ("int" if pa.types.is_integer(v.values.type) else "str")
        vocabs[name] = {"size": v.size, "hashed": v.hashed, "fixed": v.fixed, "kind": kind,
                        "values": v.values}
    dense = {k: {"n": s.n, "total": s.total, "total_sq": s.total_sq, "nulls": s.nulls}
             for k, s in enc.dense.items()}
    return {"kind": KIND, "spec": asdict(enc.spec), "surfaces": list(enc.surfaces), "vocabs": vocabs,
            "dense": dense}


def _values(v: dict[str, Any], name: str) -> pa.Array | None:
    values = v.get("values")
    if values is None:
        return None
    typ = _TYPES[v["kind"]]
    arr = values if isinstance(values, pa.Array) else pa.array(values, typ)
    if arr.type != typ or arr.null_count:
        raise ValueError(f"vocabulary {name!r}: values are {arr.type} with {arr.null_count} null(s), "
                         f"expected {typ} without nulls")
    if not v["hashed"] and not v["fixed"] and len(arr) != int(v["size"]) - 1:
        raise ValueError(f"vocabulary {name!r}: {len(arr)} values for size {v['size']} (expected size - 1)")
    return arr


def encoders_from_dict(d: dict[str, Any], where: str = ENCODERS_FILE) -> Encoders:
    """``Encoders`` from :func:`encoders_to_dict`'s form (values as Arrow arrays or lists); a record that is
    not the importer's is an AdapterError naming ``where``."""
    try:
        if d.get("kind") != KIND:
            raise ValueError(f"kind {d.get('kind')!r}, expected {KIND!r}")
        spec = spec_from_dict(d["spec"], f"{where} spec")
        vocabs = {}
        for name, v in d["vocabs"].items():
            if v.get("values") is None and not (v["hashed"] or v["fixed"]) and "file" in v:
                raise ValueError(f"vocabulary {name!r}: values in {v['file']} were not read")
            vocabs[name] = CategoryVocab(name, _values(v, name), int(v["size"]), bool(v["hashed"]),
                                         bool(v["fixed"]))
        dense = {k: DenseStats(int(s["n"]), float(s["total"]), float(s["total_sq"]), int(s["nulls"]))
                 for k, s in d["dense"].items()}
        surfaces = [str(s) for s in d["surfaces"]]
    except (KeyError, TypeError, ValueError, AttributeError, pa.ArrowException) as e:
        raise AdapterError(f"{where}: not the importer's encoders ({type(e).__name__}: {e})") from None
    return Encoders(spec, vocabs, dense, surfaces, [0, 0, 0], pa.array(surfaces, pa.string()))


def _file_name(name: str, i: int, taken: set[str]) -> str:
    stem = name if _SAFE_NAME.fullmatch(name) else f"vocab-{i}"
    while f"{stem}.parquet".lower() in taken:  # case-insensitive file systems
        stem = f"{stem}-{i}"
    taken.add(f"{stem}.parquet".lower())
    return f"{VOCAB_DIR}/{stem}.parquet"


def save_vocabularies(d: dict[str, Any], folder: str | Path) -> dict[str, Any]:
    """Write every vocabulary's values under ``folder/_encoders/``; returns the JSON-able record (values
    replaced by ``file``, ``sha256`` and ``count``). ``d`` is :func:`encoders_to_dict`'s form."""
    folder = Path(folder)
    out = {**d, "format_version": FORMAT_VERSION, "vocabs": {}}
    taken: set[str] = set()
    for i, (name, v) in enumerate(d["vocabs"].items()):
        rec = {k: v[k] for k in ("size", "hashed", "fixed", "kind")}
        arr = _values(v, name)
        if arr is not None:
            rel = _file_name(name, i, taken)
            (folder / VOCAB_DIR).mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({VALUE_COLUMN: arr}), folder / rel)
            rec.update(file=rel, sha256=sha256_of(folder / rel), count=len(arr))
        out["vocabs"][name] = rec
    return out


def load_vocabularies(record: dict[str, Any], folder: str | Path, where: str = ENCODERS_FILE
                      ) -> dict[str, Any]:
    """``record`` (as written by :func:`save_vocabularies`) with each vocabulary's values read back from
    ``folder``: digest, column, type and length checked; a mismatch is an AdapterError."""
    folder = Path(folder)
    out = {**record, "vocabs": {}}
    try:
        items = record["vocabs"].items()
    except (KeyError, AttributeError) as e:
        raise AdapterError(f"{where}: not the importer's encoders ({type(e).__name__}: {e})") from None
    for name, v in items:
        if not isinstance(v, dict):
            raise AdapterError(f"{where}: vocabulary {name!r} is not an object")
        v = dict(v)
        rel = v.get("file")
        if rel is not None:
            if not isinstance(rel, str) or not VOCAB_FILE.fullmatch(rel):
                raise AdapterError(f"{where}: vocabulary {name!r} names file {rel!r}, "
                                   f"not {VOCAB_DIR}/NAME.parquet")
            f = folder / rel
            if not f.is_file():
                raise AdapterError(f"{f}: missing (vocabulary {name!r} of {where}); copy the whole folder")
            if sha256_of(f) != v.get("sha256"):
                raise AdapterError(f"{f}: sha256 differs from {where}'s; the vocabulary changed after it was "
                                   "written (not used: convert or export again)")
            try:
                table = pq.read_table(f)
            except (OSError, pa.ArrowException) as e:
                raise AdapterError(f"{f}: unreadable vocabulary ({type(e).__name__}: {e})") from None
            if table.column_names != [VALUE_COLUMN] or table.num_rows != v.get("count"):
                raise AdapterError(f"{f}: expected one column {VALUE_COLUMN!r} of {v.get('count')} rows, got "
                                   f"{table.column_names} with {table.num_rows}")
            v["values"] = table[VALUE_COLUMN].combine_chunks()
        out["vocabs"][name] = v
    encoders_from_dict(out, where)  # every check of the record, now with its values
    return out


def write_encoders(enc: Encoders, folder: str | Path, text_columns: list[str] | None = None) -> Path:
    """The importer's fitted encoders into ``folder`` (``encoders.json`` + ``_encoders/``);
    ``text_columns``: the categorical columns the sources held as text (a hashed one hashes text)."""
    folder = Path(folder)
    record = save_vocabularies({**encoders_to_dict(enc), "text_columns": sorted(text_columns or [])}, folder)
    path = folder / ENCODERS_FILE
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return path


def read_encoders(folder: str | Path) -> dict[str, Any] | None:
    """The encoders a dataset folder holds (in-memory form, values read and verified), or None when the
    dataset was not converted by this importer (or by an older one that did not write them)."""
    path = Path(folder) / ENCODERS_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AdapterError(f"{path}: unreadable ({type(e).__name__}: {e}); "
                           "convert the dataset again") from None
    if not isinstance(record, dict):
        raise AdapterError(f"{path}: not the importer's encoders")
    return load_vocabularies(record, folder, str(path))
