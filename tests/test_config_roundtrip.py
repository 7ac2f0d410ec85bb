"""Every config dataclass survives save -> load unchanged (issue 10, section 4).

``evaluate`` and ``--resume`` rebuild the model from RUN/config.toml, so a value the TOML writer drops or
changes (an empty list, an empty table, 1e-8, a quoted or non-ASCII string) rebuilds a different model
than the one trained. Values are generated from each field's type, so a field added later is covered
without editing this file, and a config dataclass added later fails ``test_every_config_class_is_covered``
until it is listed here.
"""

from __future__ import annotations

import ast
import dataclasses
import tomllib
import typing
from pathlib import Path
from typing import Any

import pytest

from opengem.bench.ablation import AblationConfig
from opengem.bench.isoflop import IsoflopConfig
from opengem.bench.scale import SweepConfig
from opengem.cli import main
from opengem.config import from_dict, load_config, save_config, to_dict
from opengem.data.schema import (
    DenseFeature,
    FeatureSchema,
    SequenceField,
    SequenceGroup,
    SparseFeature,
    Task,
    dumps_toml,
)
from opengem.data.sim_config import SimConfig
from opengem.demo import DemoConfig
from opengem.serve.server import ServeConfig
from opengem.train.config import RunConfig
from opengem.transfer.distill_config import DistillConfig
from opengem.transfer.experiment_config import ExperimentConfig
from opengem.transfer.vm_train import ArmConfig

SRC = Path(__file__).resolve().parents[1] / "src" / "opengem"
ROOTS = [RunConfig, SimConfig, ExperimentConfig, SweepConfig, ArmConfig, DistillConfig, IsoflopConfig,
         DemoConfig, ServeConfig, AblationConfig]
# Dataclasses named *Config that are not loaded from or saved to TOML (none today).
NOT_TOML: set[str] = set()

TRICKY_STR = 'q"uo\'te \\ back ünï€ 中 \t tab'
TRICKY_DICT = {
    "empty_list": [],
    "empty_table": {},
    "nested": {"a": {"b": [1, -2], "c": {}}, "list_of_lists": [[], [0.1, 1e-8]]},
    "tiny": 1e-8,
    "tenth": 0.1,
    "neg": -3,
    "negf": -2.5e-12,
    "big": 2**62,
    "s": TRICKY_STR,
    "dotted.key": True,
    "tables": [{"x": 1}, {"y": []}],
}


def _value(tp: Any, default: Any, variant: int) -> Any:
    """A value of type ``tp`` different from ``default``; variant 0 leans to empty containers."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return _instance(tp, variant)
    if tp is bool:
        return not default
    if tp is int:
        return -7 if variant == 0 else (default if isinstance(default, int) else 0) + 123_456_789
    if tp is float:
        return (1e-8, 0.1, -2.5)[variant % 3] if default != (1e-8, 0.1, -2.5)[variant % 3] else 3.25
    if tp is str:
        return TRICKY_STR if variant == 0 else f"{default or 'v'}-é\"x\""
    if origin is list:
        (inner,) = args
        if variant == 0:
            return []
        return [_value(inner, None, 0), _value(inner, None, 1)]
    if origin is dict:
        if variant == 0:
            return {}
        inner = args[1] if len(args) == 2 else Any
        if inner is Any:
            return dict(TRICKY_DICT)
        return {"k.dot": _value(inner, None, 1), TRICKY_STR: _value(inner, None, 2)}
    if tp is Any:
        return TRICKY_DICT
    raise AssertionError(f"no test value for type {tp!r}: extend _value")


def _instance(cls: type, variant: int) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        kwargs[f.name] = _value(hints[f.name], default, variant)
    return cls(**kwargs)


def _reachable(cls: type, seen: set[type]) -> set[type]:
    if cls in seen:
        return seen
    seen.add(cls)
    for tp in typing.get_type_hints(cls).values():
        for t in (tp, *typing.get_args(tp)):
            if dataclasses.is_dataclass(t) and isinstance(t, type):
                _reachable(t, seen)
    return seen


def _roundtrip(cls: type, cfg: Any) -> Any:
    return from_dict(cls, tomllib.loads(dumps_toml(to_dict(cfg))), "")


@pytest.mark.parametrize("variant", [0, 1], ids=["empty-containers", "filled"])
@pytest.mark.parametrize("cls", ROOTS, ids=lambda c: c.__name__)
def test_config_roundtrips_exactly(cls: type, variant: int) -> None:
    cfg = _instance(cls, variant)
    assert cfg != cls()  # the generated values differ from the defaults
    assert _roundtrip(cls, cfg) == cfg


@pytest.mark.parametrize("cls", ROOTS, ids=lambda c: c.__name__)
def test_defaults_roundtrip_through_a_file(cls: type, tmp_path: Path) -> None:
    save_config(cls(), tmp_path / "c.toml")
    assert load_config(cls, tmp_path / "c.toml") == cls()


def test_empty_head_hidden_survives_save_and_load(tmp_path: Path) -> None:
    """The case from the issue: model.head.hidden=[] came back as the default [64]."""
    cfg = load_config(RunConfig, None, ["model.head.hidden=[]", "model.gem.wukong.mlp_dims=[]",
                                        "train.sparse_eps=1e-8", "data.sim={}"])
    assert cfg.model.head.hidden == []
    save_config(cfg, tmp_path / "config.toml")
    again = load_config(RunConfig, tmp_path / "config.toml")
    assert again.model.head.hidden == [] and again.model.gem.wukong.mlp_dims == []
    assert again == cfg


def test_every_config_class_is_covered() -> None:
    """Each ``@dataclass class *Config`` in src is reachable from a root tested above."""
    declared = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Config") and any(
                "dataclass" in ast.unparse(d) for d in node.decorator_list
            ):
                declared.add(node.name)
    covered: set[type] = set()
    for root in ROOTS:
        _reachable(root, covered)
    missing = declared - {c.__name__ for c in covered} - NOT_TOML
    assert not missing, f"config dataclasses with no round-trip test: {sorted(missing)}"
    assert {"RunConfig", "SimConfig", "ExperimentConfig", "SweepConfig", "HeadConfig"} <= declared


def test_schema_roundtrips_with_tricky_values() -> None:
    schema = FeatureSchema(
        name=TRICKY_STR,
        surfaces=("feed", "ünï \"s\""),
        tasks=(Task("click", weight=1e-8), Task("conv", column="conv_label", weight=0.1)),
        sparse=(SparseFeature("u", vocab=2**40, dim=3, multi_valued=True, pooling="mean", table="t",
                              on_oov="hash"),),
        dense=(DenseFeature("d", on_nan="zero"),),
        sequences=(SequenceGroup("h", 5, (SequenceField("item", vocab=7, dim=3, table="t"),
                                          SequenceField("dt", kind="dense"))),),
        extra={"empty_list": [], "empty_table": {}, "nested": {"a": [{"b": []}]}, "f": -1e-8},
    )
    again = FeatureSchema.from_dict(tomllib.loads(schema.to_toml()))
    assert again == schema
    assert again.extra == schema.extra  # extra is compare=False: check it explicitly


@pytest.mark.slow
def test_run_with_an_empty_list_can_be_evaluated(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """End to end: train with model.head.hidden=[], then evaluate rebuilds the same model from config.toml."""
    tiny = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"
    run = tmp_path / "run"
    assert main(["train", "--config", str(tiny), "--out", str(run), "model.head.hidden=[]", "train.steps=2",
                 "train.progress=false", "data.sim.rows=600"]) == 0
    assert load_config(RunConfig, run / "config.toml").model.head.hidden == []
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run)]) == 0, capsys.readouterr().err
