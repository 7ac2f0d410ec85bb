from dataclasses import dataclass, field

import pytest

from opengem.config import ConfigError, load_config, save_config


@dataclass
class Inner:
    width: int = 4
    rate: float = 0.1
    names: list[str] = field(default_factory=list)


@dataclass
class Outer:
    name: str = "x"
    inner: Inner = field(default_factory=Inner)
    flag: bool = False


def test_toml_then_overrides_then_roundtrip(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('name = "a"\n[inner]\nwidth = 8\n')
    cfg = load_config(Outer, p, ["inner.rate=0.5", "flag=true", "inner.names=['u','v']", "name=bare"])
    assert cfg == Outer(name="bare", inner=Inner(width=8, rate=0.5, names=["u", "v"]), flag=True)
    save_config(cfg, tmp_path / "resolved.toml")
    assert load_config(Outer, tmp_path / "resolved.toml") == cfg


def test_unknown_and_mistyped_keys_fail_with_path(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'widht' \\(did you mean 'width'\\? known: "):
        load_config(Outer, None, ["inner.widht=3"])
    with pytest.raises(ConfigError, match=r"unknown key 'zzz' \(known: "):  # nothing close: no guess
        load_config(Outer, None, ["inner.zzz=3"])
    with pytest.raises(ConfigError, match=r"inner.width: expected an integer"):
        load_config(Outer, None, ["inner.width=2.5"])


def test_flatten_dict_joins_nested_keys_with_the_separator():
    from opengem.config import flatten_dict

    d = {"a": {"b": 1, "c": {"d": [2]}}, "e": 3}
    assert flatten_dict(d) == {"a.b": 1, "a.c.d": [2], "e": 3}
    assert flatten_dict(d, "/") == {"a/b": 1, "a/c/d": [2], "e": 3}
