"""A run's data: where its dataset is (made from the simulator when none is named) and its loaders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from opengem.data.commit import read_marker
from opengem.data.dataset import Dataset
from opengem.data.loader import ParquetLoader
from opengem.data.sim_config import SimConfig
from opengem.data.simulate import simulate
from opengem.errors import UsageError
from opengem.train import distributed
from opengem.train.config import DataConfig

SIM_MARKER = ".opengem_sim_config.json"


def data_location(cfg: DataConfig, run_dir: str | Path, data_dir: str | Path | None = None) -> Path:
    """Where the run's dataset is (resolved, as config.toml records it), without reading or making it."""
    named = data_dir or cfg.path
    return Path(named).resolve() if named else (Path(run_dir) / "data").resolve()


def prepare_data(cfg: DataConfig, run_dir: str | Path, data_dir: str | Path | None = None, *,
                 replace: bool = False) -> Path:
    """The dataset folder of a run: --data, else data.path, else the embedded default in RUN/data.

    The default is simulated once and reused while the simulator config is the same. A complete dataset
    simulated with another config is kept and refused (the runs that read it would silently point at other
    rows; a study's ``OUT/data`` is shared by every run in it), unless ``replace``: a scratch cache such as
    the benchmarks' folder, where the new dataset replaces the old only once it is complete."""
    path = data_location(cfg, run_dir, data_dir)
    if data_dir or cfg.path:
        Dataset(path)  # fail early and clearly when it is not a dataset
        return path
    sim = SimConfig.from_dict(dict(cfg.sim))
    made = simulated_with(path)
    if made == sim.to_dict():
        return path  # same simulator config: reuse
    if made is not None and not replace:
        changes = sim_config_changes(made, sim.to_dict())
        raise UsageError(f"{path}: holds data simulated with another simulator config ({changes}), which the "
                         "runs beside it read; it is kept: choose another output folder, or delete it to "
                         "simulate anew")
    if made is None and path.exists():  # a writer killed before it finished: nothing complete to lose
        shutil.rmtree(path)
    simulate(sim, path, force=True)  # staged: a dataset there is replaced only once the new one is complete
    (path / SIM_MARKER).write_text(json.dumps(sim.to_dict()))
    return path


def simulated_with(path: Path) -> dict[str, Any] | None:
    """The simulator config of the complete dataset in ``path`` ({} when it is complete but was not
    simulated, or says nothing readable about how), None when there is no complete dataset there."""
    if not path.is_dir() or read_marker(path) is None:
        return None
    for name, key in ((SIM_MARKER, None), ("summary.json", "config")):
        try:
            doc = json.loads((path / name).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        found = doc.get(key) if key and isinstance(doc, dict) else doc
        if isinstance(found, dict):
            return found
    return {}


def sim_config_changes(old: dict[str, Any], new: dict[str, Any]) -> str:
    """``key old -> new, ...`` of two simulator configs (the first four), as the refusals name them."""
    changed = [f"{k} {old.get(k, '-')} -> {new.get(k, '-')}" for k in sorted({*old, *new})
               if old.get(k) != new.get(k)]
    return ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")


def make_loader(ds: Dataset, spec: str, cfg: DataConfig, *, train: bool, seed: int = 0,
                spread_rows: int = 0) -> ParquetLoader:
    """This rank's loader over the partitions ``spec`` selects; evaluation never shuffles or mixes rows.
    ``spread_rows`` > 0 (evaluation only): that many rows spread evenly over the partitions' row groups."""
    if train and spread_rows:
        raise ValueError("spread_rows samples evaluation rows; a training loader reads every row")
    batch_size = cfg.batch_size if train or not cfg.eval_batch_size else cfg.eval_batch_size
    return ParquetLoader(ds.files(spec), ds.schema, batch_size, rank=distributed.rank(),
                         world_size=distributed.world_size(), num_workers=cfg.num_workers,
                         on_error=cfg.on_error or None, drop_last=train,
                         shuffle_units=train and cfg.shuffle, seed=seed,
                         shuffle_window=cfg.shuffle_window if train else 0, spread_rows=spread_rows)
