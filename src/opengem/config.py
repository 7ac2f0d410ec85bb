"""Dataclass configs loaded from TOML and overridden from the command line with ``section.key=value``.

Every component keeps its own dataclass next to its code; this module only knows how to fill a
(possibly nested) dataclass from a dict strictly (unknown keys fail, naming the key), how to apply
dotted overrides with values parsed as TOML literals, and how to write the resolved config back as
TOML next to a run's outputs. The written file must read back to the same config: ``evaluate`` and
``--resume`` rebuild the model from it, and a value that does not survive the trip (an empty list, a
float) rebuilds a different model.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from opengem.data.schema import dumps_toml, read_toml
from opengem.errors import UsageError, unknown_key

T = TypeVar("T")


class ConfigError(UsageError, ValueError):
    """A config file or override that does not fit the config dataclass."""


class BareWord(str):
    """An override value that is not a TOML literal (``model.name=dlrm``).

    It is taken as a string only where the config declares a string; anywhere else (a number, a list,
    an untyped table such as ``data.sim``) it is refused, naming the override, because guessing would
    turn ``data.sim.rows=abc`` into a crash deep in the run instead of a message here.
    """


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _key(where: str, k: object) -> str:
    return f"{where}.{k}" if where else str(k)


def _bare_hint(value: Any) -> str:
    if isinstance(value, BareWord):
        return " (not a TOML literal, so read as a bare word; strings need quotes)"
    return ""


def _expected(where: str, what: str, value: Any) -> ConfigError:
    shown = str(value) if isinstance(value, BareWord) else repr(value)
    return ConfigError(f"{where}: expected {what}, got {shown}{_bare_hint(value)}")


def _refuse_bare(value: Any, where: str) -> Any:
    """Values under an untyped key (``Any``, ``dict[str, Any]``) must be TOML literals, not bare words."""
    if isinstance(value, BareWord):
        raise ConfigError(
            f"{where}: {value!s} is not a TOML literal and this key has no declared type, so it is not read "
            f"as a string: write a number, true/false or [list], or quote a string ('{where}=\"{value!s}\"')"
        )
    if isinstance(value, dict):
        return {k: _refuse_bare(v, _key(where, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_refuse_bare(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise _expected(where, "a table", value)
        return from_dict(tp, value, where)
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        if value is None and type(None) in args:
            return None
        for a in non_none:
            try:
                return _coerce(value, a, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: {value!r} does not fit {tp}{_bare_hint(value)}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise _expected(where, "a list", value)
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise _expected(where, "a table", value)
        inner = args[1] if len(args) == 2 else Any
        return {k: _coerce(v, inner, _key(where, k)) for k, v in value.items()}
    if tp is Any:
        return _refuse_bare(value, where)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _expected(where, "a number", value)
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _expected(where, "an integer", value)
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise _expected(where, "true/false", value)
        return value
    if tp is str:
        if not isinstance(value, str):
            raise _expected(where, "a string", value)
        return str(value)
    return value


def from_dict(cls: type[T], data: dict[str, Any], where: str = "config") -> T:
    """Build ``cls`` from a dict, failing on unknown keys and wrong types with the key's path."""
    hints = _field_types(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for k in data:
        if k not in names:
            raise ConfigError(f"{_key(where, k)}: {unknown_key(k, names)}")
    kwargs = {k: _coerce(v, hints[k], _key(where, k)) for k, v in data.items()}
    return cls(**kwargs)


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], value); a value that is not a TOML literal is a BareWord."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected section.key=value")
    key, raw = text.split("=", 1)
    path = key.strip().split(".")
    if not all(path):
        raise ConfigError(f"override {text!r}: empty name in {key.strip()!r} (expected section.key=value)")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = BareWord(raw)  # bare strings need no quotes where the config declares a string
    return path, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for p in path[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: {p!r} is not a section")
        node[path[-1]] = value
    return data


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Fill ``cls`` from a TOML file, then overrides; an error names the file or the override."""
    data: dict[str, Any] = read_toml(path, ConfigError, "config") if path is not None else {}
    data = apply_overrides(data, overrides or [])
    try:
        return from_dict(cls, data, "")
    except ConfigError as e:
        raise ConfigError(f"{_source(str(e), overrides or [], path)}: {e}") from None


def _source(message: str, overrides: list[str], path: str | Path | None) -> str:
    """Where the bad value came from: the last override that set the key the message names, else the file."""
    key = message.split(":", 1)[0]
    for text in reversed(overrides):
        okey = text.split("=", 1)[0].strip()
        if key == okey or key.startswith(okey + ".") or key.startswith(okey + "[") \
                or okey.startswith(key + "."):
            return f"override {text}"
    return str(path) if path is not None else "config"


def save_config(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as TOML that :func:`load_config` reads back to an equal config; replaced
    whole (a process killed while writing leaves the old file, never half of one)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(dumps_toml(to_dict(cfg)), encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def flatten_dict(d: dict[str, Any], sep: str = ".", prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level with joined keys (``a.b.c``), for overrides, tables and log tags."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten_dict(v, sep, key + sep))
        else:
            out[key] = v
    return out


def nonfinite_floats(cfg: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(key, value) of every field holding a NaN or infinite float in a (nested) config dataclass, lists
    included: a NaN passes every ``<`` / ``>`` check as false, so range checks alone let it through to the
    first step."""
    out: list[tuple[str, Any]] = []
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            out += nonfinite_floats(v, key + ".")
            continue
        flat = [x for row in v for x in (row if isinstance(row, (list, tuple)) else [row])] \
            if isinstance(v, (list, tuple)) else [v]
        if any(isinstance(x, float) and not math.isfinite(x) for x in flat):
            out.append((key, v))
    return out


def require_finite(*parts: tuple[Any, str]) -> None:
    """ConfigError ``key = value: must be a finite number`` for the first non-finite float of the (config,
    key prefix) ``parts``, in order."""
    for cfg, prefix in parts:
        for key, value in nonfinite_floats(cfg, prefix)[:1]:
            raise ConfigError(f"{key} = {value!r}: must be a finite number")
