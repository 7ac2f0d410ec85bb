"""The experiment's stream: a simulated one per seed, or a real dataset cut into day windows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from opengem.config import ConfigError
from opengem.data.commit import mark_complete
from opengem.data.dataset import Dataset
from opengem.data.sim_config import SimConfig
from opengem.data.simulate import simulate
from opengem.transfer.experiment_config import ExperimentConfig


def prepare_data(cfg: ExperimentConfig, seed: int, root: Path) -> Path:
    src = cfg.data
    if src.kind == "sim":
        out = root / "data"
        if not (out / "summary.json").exists():
            simulate(SimConfig.from_dict({**src.sim, "seed": seed}), out, force=True)
        return out
    if src.kind != "dataset":
        raise ConfigError(f"data.kind: sim | dataset, got {src.kind!r}")
    if not src.repartition_days:
        return Path(src.path)
    out = root.parent / "data_days"  # one cut shared by every seed (seeds vary FM/VM init)
    if (out / "schema.toml").exists():
        return out
    ds = Dataset(src.path)
    t = pa.concat_tables([pq.read_table(f) for f in ds.files("@all")], promote_options="permissive")
    ts = t.column(ds.schema.time_column).to_numpy()
    day = (ts + src.day_offset) // src.ts_per_day
    if src.row_fraction < 1:
        h = t.column(ds.schema.example_id_column).to_numpy().astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        keep = (h >> np.uint64(40)).astype(np.float64) / float(1 << 24) < src.row_fraction
    else:
        keep = np.ones(len(day), bool)
    days = np.unique(day)
    if src.last_days:
        days = days[-src.last_days :]
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    for i, d in enumerate(days):
        sel = keep & (day == d)
        part = t.filter(pa.array(sel))
        part = part.sort_by([(ds.schema.time_column, "ascending")])
        (tmp / f"day={i:03d}").mkdir(exist_ok=True)
        pq.write_table(part, tmp / f"day={i:03d}" / "part-00000.parquet", row_group_size=20_000)
    ds.schema.save(tmp / "schema.toml")
    mark_complete(tmp, "opengem transfer: day windows")
    tmp.rename(out)
    return out


def window_len(ds: Dataset) -> float:
    spans = []
    for p in ds.partitions():
        ts = pc.min_max(pq.read_table(ds.files(p)[0], columns=[ds.schema.time_column]).column(0))
        spans.append(ts["max"].as_py() - ts["min"].as_py())
    return float(max(np.median(spans), 1))
