"""A model family's size ladder and the NE a study selects on, shared by the scaling sweep (bench/scale.py)
and the iso-FLOP study (bench/isoflop.py), so neither imports the other."""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from opengem.config import ConfigError, flatten_dict


@dataclass
class FamilySweep:
    name: str = ""
    model: str = ""  # model.name of every run ("" = name)
    overrides: list[str] = field(default_factory=list)  # applied to every size of this family
    grid: dict[str, Any] = field(default_factory=dict)  # knob -> values: the cartesian product is the sizes
    sizes: list[dict[str, Any]] = field(default_factory=list)  # explicit sizes: tables of knob = value


def _literal(v: Any) -> str:
    """A value as a TOML literal for a dotted override."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_literal(x) for x in v) + "]"
    return repr(v)


def size_overrides(fam: FamilySweep) -> list[list[str]]:
    """One override list per size: the explicit sizes, then the grid's cartesian product."""
    sizes = [[f"{k}={_literal(v)}" for k, v in flatten_dict(s).items()] for s in fam.sizes]
    grid = flatten_dict(fam.grid)
    if grid:
        keys = list(grid)
        values = [v if isinstance(v, list) else [v] for v in grid.values()]
        for combo in itertools.product(*values):
            sizes.append([f"{k}={_literal(v)}" for k, v in zip(keys, combo)])
    return sizes


def select_ne(metrics: dict[str, dict[str, Any]], keys: list[str]) -> float:
    vals = [metrics[k]["ne"] for k in keys if k in metrics and metrics[k]["ne"] == metrics[k]["ne"]]
    return float(np.mean(vals)) if len(vals) == len(keys) and vals else float("nan")


def selection_ne(metrics: dict[str, Any] | None, metric: str) -> float:
    """The one NE a run is ranked by (``metric``: a study's config), over the keys ``metric_keys`` picks from
    the run's own; NaN when a key is missing."""
    if not metrics:
        return float("nan")
    return select_ne(metrics, metric_keys(metric, sorted(metrics)))


METRIC_FORMS = ("surface_task", "tasks")  # or one NE key such as "all/click"


def check_metric(metric: str, where: str) -> None:
    """Refuse at load time a metric that can be neither form nor a ``surface/task`` key (it would fail only
    after the first run, or never in a plan)."""
    if metric not in METRIC_FORMS and not re.fullmatch(r"[^/\s]+/[^/\s]+", metric):
        raise ConfigError(f"{where}: metric must be surface_task, tasks or one NE key such as all/click "
                          f"(got {metric!r})")


def metric_keys(metric: str, available: list[str]) -> list[str]:
    if metric == "surface_task":
        keys = [k for k in available if not k.startswith("all/")]
    elif metric == "tasks":
        keys = [k for k in available if k.startswith("all/")]
    else:
        keys = [metric] if metric in available else []
    if not keys:
        raise ConfigError(f"sweep.metric = {metric!r}: no such NE key (have: {', '.join(sorted(available))})")
    return sorted(keys)


def oracle_with_totals(data_path: Path, spec: str) -> dict[str, float]:
    """Oracle NE per surface/task plus ``all/<task>`` (pooled over surfaces, as the evaluator pools)."""
    from opengem.data.oracle import accumulate

    acc = accumulate(data_path, spec)
    return {**acc.results(), **acc.pooled_by_task().results()}
