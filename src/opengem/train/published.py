"""A run's published versions, read: ``RUN/versions/vNNNN/`` (a checkpoint, or a training run folder with
config.toml + checkpoints/) with ``manifest.json`` naming the version and ``trained_through_ts``.

Why apart from ``opengem.transfer.versions`` (which trains versions and picks one per example): evaluation,
prediction, export and serving read one version without importing the trainer (the trainer imports
evaluation).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opengem.data.commit import atomic_write_text
from opengem.errors import OpengemError
from opengem.train import checkpoint as ckpt

VERSIONS = "versions"
VERSION_NAME = re.compile(r"v\d+")


@dataclass(frozen=True)
class FMVersion:
    version: int
    trained_through_ts: int
    path: Path  # the version's folder: a checkpoint (online), or a run folder (config.toml + checkpoints/)
    partitions: tuple[str, ...] = ()  # every partition the version's weights trained on (its whole chain)
    mode: str = "scratch"  # scratch | warm (opengem.transfer.versions); a manifest without the key (written
    # before warm versions existed, or by the online trainer) reads as scratch
    new_partitions: tuple[str, ...] = ()  # warm: the partitions this version's own run trained on
    init_from: int | None = None  # warm: the version whose final state it started from (None: fresh)


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
    new = rec.get("new_partitions", ())
    for key, val in (("partitions", parts), ("new_partitions", new)):
        if not isinstance(val, (list, tuple)) or not all(isinstance(p, str) for p in val):
            raise VersionError(f"{m}: '{key}' must be a list of partition names, found {val!r}")
    init_from = rec.get("init_from")
    if init_from is not None and not isinstance(init_from, int):
        raise VersionError(f"{m}: 'init_from' must be a version number or null, found {init_from!r}")
    mode = str(rec.get("mode", "scratch"))
    return FMVersion(version, through, d, tuple(parts), mode, tuple(new), init_from)


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


VERSION_SUFFIX = re.compile(r"v?(\d+)")


def split_version(spec: str | Path) -> tuple[Path, int | None]:
    """``RUN@3`` / ``RUN@v0003`` -> (RUN, 3); a folder that exists under the whole name, or a name without
    such a suffix, is a run folder as it is: (path, None). Unlike :func:`parse_fm_spec`, nothing is refused
    here: the caller says why a path that is neither is not a run."""
    path = Path(spec)
    base, at, suffix = str(spec).rpartition("@")
    found = VERSION_SUFFIX.fullmatch(suffix) if at else None
    if found is None or path.exists():
        return path, None
    return Path(base), int(found.group(1))


def version_files(v: FMVersion) -> tuple[Path, Path]:
    """(config.toml, checkpoint) of a version: the version folder's own config where it is a run folder
    (batch-trained versions), else the run's two levels up (an online version is a checkpoint of the run's
    model, RUN/versions/vNNNN; so is a batch-trained run's own checkpoint read as version 0,
    RUN/checkpoints/NAME)."""
    config = v.path / "config.toml"
    if not config.exists():
        config = v.path.parent.parent / "config.toml"
    checkpoint = v.path if (v.path / ".metadata").exists() else ckpt.latest_checkpoint(v.path)
    return config, checkpoint
