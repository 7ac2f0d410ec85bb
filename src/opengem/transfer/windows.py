"""The experiment's stream: a simulated one per seed, or a real dataset cut into day windows; and its
schedule in windows -- which FM versions are published (every ``publish_every`` windows), where the VM
starts, and which version an example in each window may use at a lag.

No leakage by construction: version k is trained on windows 0..k-1, so an example of window w may use it
only when k <= w (``versions.select_versions`` enforces trained-through < ts per example); the schedule
here only decides where the VM starts so that every lag has a version for its first window.
"""

from __future__ import annotations

import json
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
from opengem.errors import UsageError
from opengem.train.data import sim_config_changes, simulated_with
from opengem.transfer.experiment_config import ExperimentConfig
from opengem.transfer.versions import (
    FMVersion,
    VersionError,
    list_versions,
    train_fm_versions,
    train_warm_versions,
)

CUT = "cut.json"  # data_days/: how it was cut from data.path


def prepare_data(cfg: ExperimentConfig, seed: int, root: Path) -> Path:
    src = cfg.data
    if src.kind == "sim":
        out = root / "data"
        want = SimConfig.from_dict({**src.sim, "seed": seed})
        made = simulated_with(out)
        if made is None:
            simulate(want, out, force=True)
        elif made != want.to_dict():  # the FM versions and arms here were trained on it: never swapped
            raise UsageError(f"{out}: this experiment's stream was simulated with another config "
                             f"({sim_config_changes(made, want.to_dict())}); choose another --out")
        return out
    if src.kind != "dataset":
        raise ConfigError(f"data.kind: sim | dataset, got {src.kind!r}")
    if not src.repartition_days:
        return Path(src.path)
    out = root.parent / "data_days"  # one cut shared by every seed (seeds vary FM/VM init)
    cut = {"path": str(Path(src.path).resolve()), "row_fraction": src.row_fraction,
           "last_days": src.last_days, "day_offset": src.day_offset, "ts_per_day": src.ts_per_day}
    if (out / "schema.toml").exists():
        try:
            made = json.loads((out / CUT).read_text())
        except FileNotFoundError:
            made = None  # cut before the file was written: nothing to compare
        if made is not None and made != cut:
            changed = ", ".join(f"{k} {made.get(k)} -> {v}" for k, v in cut.items() if made.get(k) != v)
            raise UsageError(f"{out}: cut from the dataset with other settings ({changed}); the FM versions "
                             "and arms beside it were trained on that cut: choose another --out")
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
    (tmp / CUT).write_text(json.dumps(cut))
    mark_complete(tmp, "opengem transfer: day windows")
    tmp.rename(out)
    return out


def window_len(ds: Dataset) -> float:
    spans = []
    for p in ds.partitions():
        ts = pc.min_max(pq.read_table(ds.files(p)[0], columns=[ds.schema.time_column]).column(0))
        spans.append(ts["max"].as_py() - ts["min"].as_py())
    return float(max(np.median(spans), 1))


def published_versions(n_windows: int, every: int) -> list[int]:
    """Version numbers (= windows trained on) published over ``n_windows`` windows: every, 2 * every, ..."""
    return list(range(every, n_windows, every))


def version_for_window(window: int, every: int, lag: int) -> int:
    """The version an example of window ``window`` uses at ``lag``: the newest published one trained only
    on earlier windows, stepped back ``lag`` publications (0 = none yet)."""
    return max((window // every - lag) * every, 0)


def first_window_with_versions(cfg: ExperimentConfig, lags: list[int]) -> int:
    """The first window whose examples have an FM version at every lag."""
    return cfg.publish_every * (1 + max(lags))


def vm_surfaces(cfg: ExperimentConfig, dataset_surfaces: list[str]) -> list[str]:
    """The VM surfaces (``surfaces``, [] = all), checked against the dataset's, as is every surface that
    ``surface_history_windows`` names (a misspelt one would silently leave its surface at the default)."""
    names = cfg.surfaces or list(dataset_surfaces)
    for key, given in (("surfaces", names), ("surface_history_windows", list(cfg.surface_history_windows))):
        bad = [s for s in given if s not in dataset_surfaces]
        if bad:
            raise ConfigError(f"{key}: {bad} not in the dataset's surfaces {dataset_surfaces}")
    return names


def vm_train_windows(cfg: ExperimentConfig, lags: list[int], parts: list[str], vm_start: int,
                     surface: str = "") -> list[str]:
    """The windows a VM (of ``surface``) trains on, in order: its history windows before ``vm_start``
    (``cfg.history_windows``: trained on, never evaluated) and ``vm_start`` onwards. Every one of them needs
    an FM version at every lag (its soft labels), so the first may not come before
    ``publish_every * (1 + largest lag)``."""
    history, key = cfg.history_windows(surface)
    first = vm_start - history
    earliest = first_window_with_versions(cfg, lags)
    if first < earliest:
        raise ConfigError(
            f"{key} = {history}: the VM would train from window {first}, before "
            f"window {earliest}, the first with an FM version at lag {max(lags)} (publish_every "
            f"{cfg.publish_every}); lower it or raise vm_first_window"
        )
    return parts[first:]


def vm_start_window(cfg: ExperimentConfig, lags: list[int], n_windows: int, where: str = "") -> int:
    """The VM's first window: the configured one, but never before every lag has a version to use, and
    leaving the validation windows plus at least one evaluation window after it."""
    start = max(first_window_with_versions(cfg, lags), cfg.vm_first_window)
    need = start + 2 + cfg.validation_windows
    if need > n_windows:
        raise ConfigError(
            f"{where or 'data'}: {n_windows} windows; VM start {start} (publish_every "
            f"{cfg.publish_every} x (1 + lag {max(lags)}), vm_first_window {cfg.vm_first_window}) plus "
            f"{cfg.validation_windows} validation and 1 evaluation window needs {need} (raise data.sim.days, "
            "or lower the staleness, publish_every or vm_first_window)"
        )
    return start


def train_published_versions(fm_cfg: object, data_dir: Path, run: Path, parts: list[str],
                             every: int, mode: str = "scratch") -> list[FMVersion]:
    """Train (or reuse) exactly the published versions: version k on ``parts[:k]`` for k in
    :func:`published_versions`, from scratch each, or ``mode = "warm"``: each from the previous published
    version, on the windows since it (``versions.train_warm_versions``). A run folder holding other
    versions (another publish_every) or versions of the other mode is refused: the side tables would pick
    them up."""
    ks = published_versions(len(parts), every)
    if run.is_dir():
        listed = _listed(run)
        extra = sorted({v.version for v in listed} - set(ks))
        if extra:
            raise ConfigError(f"{run}: holds FM versions {extra} outside this publish_every={every} schedule "
                              f"{ks}; use a fresh --out")
        other = sorted(v.version for v in listed if v.mode != mode)
        if other:
            raise ConfigError(f"{run}: holds FM versions {other} not trained fm_versions = {mode!r}; use a "
                              "fresh --out")
    if mode == "warm":
        return train_warm_versions(fm_cfg, data_dir, run, parts, ks)
    for k in ks:
        train_fm_versions(fm_cfg, data_dir, run, parts[: k + 1], first=k)
    return list_versions(run)


def _listed(run: Path) -> list[FMVersion]:
    try:
        return list_versions(run)
    except VersionError:  # no versions/ folder or none published yet
        return []
