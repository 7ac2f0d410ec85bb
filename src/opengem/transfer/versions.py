"""Published FM versions and the no-leakage rule that picks one per example.

A version is a trained FM frozen at a point in time: ``RUN/versions/vNNNN/`` holds a training run
(config.toml + checkpoints/) and ``manifest.json`` with at least ``version`` and ``trained_through_ts``
(the newest example time the version saw). The online trainer (``opengem.train.online``) publishes
versions in this layout; when no online run exists, :func:`train_fm_versions` produces them by training
the FM on growing, time-ordered partition sets with the batch trainer.

No leakage: an example at time t may only be labelled by a version whose trained-through ts is strictly
older than t. Staleness (``lag``) then steps back ``lag`` further versions, modelling an FM refreshed
less often than the VM.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from opengem.data.commit import atomic_write_text
from opengem.data.dataset import Dataset
from opengem.errors import OpengemError
from opengem.train.trainer import train

VERSIONS = "versions"
VERSION_NAME = re.compile(r"v\d+")


@dataclass(frozen=True)
class FMVersion:
    version: int
    trained_through_ts: int
    path: Path  # the version's run folder (config.toml + checkpoints/)
    partitions: tuple[str, ...] = ()


class VersionError(OpengemError, ValueError):
    pass


def version_dir(run: str | Path, version: int) -> Path:
    return Path(run) / VERSIONS / f"v{version:04d}"


def write_manifest(path: str | Path, version: int, trained_through_ts: int, **extra: Any) -> None:
    path = Path(path)
    rec = {"version": version, "trained_through_ts": int(trained_through_ts), **extra}
    atomic_write_text(path / "manifest.json", json.dumps(rec, indent=2))


def list_versions(run: str | Path) -> list[FMVersion]:
    """Every published version of an FM run, oldest trained-through first.

    Accepts ``RUN`` (reads RUN/versions/vNNNN/manifest.json) and tolerates ``trained_through`` as the key
    name. A version folder without a manifest is still being written and is ignored, and so is one moved
    aside (``vNNNN.old-<time>``, see ``train_fm_versions``).
    """
    root = Path(run) / VERSIONS
    if not root.is_dir():
        raise VersionError(
            f"{run}: no {VERSIONS}/ folder (train FM versions first: "
            "opengem.transfer.versions.train_fm_versions or online training)"
        )
    out = []
    for d in sorted(root.glob("v*")):
        m = d / "manifest.json"
        if VERSION_NAME.fullmatch(d.name) and m.exists():  # not vNNNN.old-<time>: a version moved aside
            out.append(_read_version(d, m))
    if not out:
        raise VersionError(f"{root}: no published version (no v*/manifest.json)")
    return sorted(out, key=lambda v: (v.trained_through_ts, v.version))


def read_version(run: str | Path, version: int) -> FMVersion:
    """One published version of ``run`` from its own manifest only: a damaged manifest of *another*
    version does not make this one unreadable (hot swap and ``opengem export RUN@N`` load one version;
    a VersionError names the manifest when it is this version's that is damaged or missing)."""
    d = version_dir(run, version)
    m = d / "manifest.json"
    if not m.is_file():
        raise VersionError(f"{run}: no published version {version} (no {m})")
    v = _read_version(d, m)
    if v.version != version:
        raise VersionError(f"{m}: says version {v.version}, its folder is {d.name}")
    return v


def _read_version(d: Path, m: Path) -> FMVersion:
    """One version from its manifest; a manifest that is not what we write is refused, naming it (it decides
    which checkpoint labels which example, so it is never guessed at)."""
    try:
        rec = json.loads(m.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise VersionError(f"{m}: unreadable manifest ({type(e).__name__}: {e}); republish the version or "
                           "delete its folder") from None
    if not isinstance(rec, dict):
        raise VersionError(f"{m}: a manifest is a JSON object, found {type(rec).__name__}")
    tt = rec.get("trained_through_ts", rec.get("trained_through"))
    if tt is None or "version" not in rec:
        raise VersionError(f"{m}: manifest needs 'version' and 'trained_through_ts'")
    parts = rec.get("partitions", ())
    try:
        version, through = int(rec["version"]), int(tt)
    except (TypeError, ValueError):
        raise VersionError(f"{m}: 'version' and 'trained_through_ts' must be integers, found "
                           f"{rec['version']!r} and {tt!r}") from None
    if not isinstance(parts, (list, tuple)) or not all(isinstance(p, str) for p in parts):
        raise VersionError(f"{m}: 'partitions' must be a list of partition names, found {parts!r}")
    return FMVersion(version, through, d, tuple(parts))


def parse_fm_spec(spec: str) -> tuple[Path, int | None]:
    """``RUN`` or ``RUN@version`` (pin one version for every example)."""
    if "@" in spec:
        run, v = spec.rsplit("@", 1)
        try:
            return Path(run), int(v.lstrip("v"))
        except ValueError:
            raise VersionError(
                f"--fm {spec!r}: version after '@' must be an integer like 3 or v0003"
            ) from None
    return Path(spec), None


def select_versions(trained_through: np.ndarray, ts: np.ndarray, lag: int = 0) -> np.ndarray:
    """Index into ``trained_through`` (sorted ascending) of the version each example may use; -1 = none.

    The newest version with trained_through < ts (strictly), then ``lag`` versions older.
    """
    if lag < 0:
        raise VersionError(f"lag must be >= 0, got {lag}")
    tt = np.asarray(trained_through, dtype=np.int64)
    if tt.size > 1 and np.any(np.diff(tt) < 0):
        raise VersionError("select_versions: trained_through must be sorted ascending")
    eligible = np.searchsorted(tt, np.asarray(ts, dtype=np.int64), side="left")  # count with tt < ts
    idx = eligible - 1 - lag
    return np.where(idx >= 0, idx, -1)


def max_ts(files: list[Path], column: str) -> int:
    """Newest example time in ``files`` (reads only the time column)."""
    best = None
    for f in files:
        col = pq.read_table(f, columns=[column]).column(0).to_numpy()
        if col.size:
            best = int(col.max()) if best is None else max(best, int(col.max()))
    if best is None:
        raise VersionError(f"no rows in {[str(f) for f in files]}")
    return best


def train_fm_versions(
    fm_cfg: Any,
    data_dir: str | Path,
    run: str | Path,
    partitions: list[str] | None = None,
    first: int = 1,
    reuse: bool = True,
) -> list[FMVersion]:
    """Version k = the FM trained on the first k time-ordered partitions (growing sets), k = first..P-1.

    The last partition never trains a version (nothing later could use it). ``reuse`` skips versions
    whose manifest already exists, and a version folder without one (training was interrupted) is resumed
    from its own newest checkpoint; ``reuse=False`` retrains every version, the old one moved aside whole
    (a version folder is a run folder, which the trainer never lets a new run overwrite or mix into).
    """
    ds = Dataset(data_dir)
    parts = partitions or ds.partitions()
    if len(parts) < 2:
        raise VersionError(f"{data_dir}: need >= 2 time-ordered partitions to publish versions, have {parts}")
    for k in range(first, len(parts)):
        vdir = version_dir(run, k)
        if reuse and (vdir / "manifest.json").exists():
            continue
        cfg = copy.deepcopy(fm_cfg)
        cfg.data.train = ",".join(parts[:k])
        cfg.data.eval = parts[k]
        cfg.train.final_eval = False
        cfg.train.progress = False
        train(cfg, vdir, data_dir, resume=reuse, force=not reuse)  # resume=True on an empty folder: fresh
        tt = max_ts([f for p in parts[:k] for f in ds.files(p)], ds.schema.time_column)
        write_manifest(vdir, k, tt, partitions=list(parts[:k]))
    return list_versions(run)
