"""Dataclass configs loaded from TOML and overridden from the command line with ``section.key=value``.

Every component keeps its own dataclass next to its code; this module only knows how to fill a
(possibly nested) dataclass from a dict strictly (unknown keys fail, naming the key), how to apply
dotted overrides with values parsed as TOML literals, and how to write the resolved config back as
TOML next to a run's outputs.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from opengem.data.schema import dumps_toml
from opengem.errors import UsageError

T = TypeVar("T")


class ConfigError(UsageError, ValueError):
    """A config file or override that does not fit the config dataclass."""


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        return from_dict(tp, value, where)
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        if value is None and type(None) in args:
            return None
        errors = []
        for a in non_none:
            try:
                return _coerce(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{where}: {value!r} does not fit {tp}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def from_dict(cls: type[T], data: dict[str, Any], where: str = "config") -> T:
    """Build ``cls`` from a dict, failing on unknown keys and wrong types with the key's path."""
    hints = _field_types(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for k in data:
        if k not in names:
            raise ConfigError(f"{where}: unknown key {k!r} (known: {', '.join(sorted(names))})")
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}") for k, v in data.items()}
    return cls(**kwargs)


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected section.key=value")
    key, raw = text.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # bare strings need no quotes on the command line
    return key.strip().split("."), value


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
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{p}: config file not found") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: not valid TOML: {e}") from None
    data = apply_overrides(data, overrides or [])
    return from_dict(cls, data, str(path) if path else "config")


def save_config(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as TOML (None values are omitted, as TOML has no null)."""
    Path(path).write_text(dumps_toml(_drop_none(to_dict(cfg))))


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


def _drop_none(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _drop_none(v) for k, v in d.items() if v is not None}
    if isinstance(d, (list, tuple)):
        return [_drop_none(v) for v in d]
    return d
