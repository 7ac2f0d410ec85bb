"""A run's data: where its dataset is (made from the simulator when none is named) and its loaders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from opengem.data.commit import read_marker
from opengem.data.dataset import Dataset
from opengem.data.loader import ParquetLoader
from opengem.data.sim_config import SimConfig
from opengem.data.simulate import simulate
from opengem.train import distributed
from opengem.train.config import DataConfig

SIM_MARKER = ".opengem_sim_config.json"


def data_location(cfg: DataConfig, run_dir: str | Path, data_dir: str | Path | None = None) -> Path:
    """Where the run's dataset is (resolved, as config.toml records it), without reading or making it."""
    named = data_dir or cfg.path
    return Path(named).resolve() if named else (Path(run_dir) / "data").resolve()


def prepare_data(cfg: DataConfig, run_dir: str | Path, data_dir: str | Path | None = None) -> Path:
    """The dataset folder of a run: --data, else data.path, else the embedded default in RUN/data."""
    path = data_location(cfg, run_dir, data_dir)
    if data_dir or cfg.path:
        Dataset(path)  # fail early and clearly when it is not a dataset
        return path
    sim = SimConfig.from_dict(dict(cfg.sim))
    marker = path / SIM_MARKER
    if marker.exists() and json.loads(marker.read_text()) == sim.to_dict() and read_marker(path) is not None:
        return path  # same simulator config: reuse
    shutil.rmtree(path, ignore_errors=True)
    simulate(sim, path)
    marker.write_text(json.dumps(sim.to_dict()))
    return path


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
