"""Published FM versions and the no-leakage rule that picks one per example.

A version is a trained FM frozen at a point in time: ``RUN/versions/vNNNN/`` holds a training run
(config.toml + checkpoints/) and ``manifest.json`` with at least ``version`` and ``trained_through_ts``
(the newest example time the version saw). The online trainer (``opengem.train.online``) publishes
versions in this layout; when no online run exists, the batch trainer produces them, in one of two ways:

- :func:`train_fm_versions` ("scratch"): version k is the FM trained from initialisation on the first k
  time-ordered partitions (growing sets; the cost grows with the square of the number of versions);
- :func:`train_warm_versions` ("warm"): version k starts from version k-1's final checkpoint (weights,
  both optimizers' state, lr schedule, RNG: the trainer's own checkpoint, loaded as a resume loads it)
  and trains only the partitions new since k-1 -- what production continuous training does, one pass
  over the stream per epoch in all.

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
from opengem.train import checkpoint as ckpt
from opengem.train.trainer import Trainer, train

VERSIONS = "versions"
VERSION_NAME = re.compile(r"v\d+")


@dataclass(frozen=True)
class FMVersion:
    version: int
    trained_through_ts: int
    path: Path  # the version's run folder (config.toml + checkpoints/)
    partitions: tuple[str, ...] = ()  # every partition the version's weights trained on (its whole chain)
    mode: str = "scratch"  # scratch | warm (module docstring); a manifest without the key (written before
    # warm versions existed, or by the online trainer) reads as scratch
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


def _version_config(fm_cfg: Any, train_parts: list[str], eval_part: str) -> Any:
    """The FM config of one version's run: ``fm_cfg`` training on ``train_parts``, evaluated on the next
    partition, quietly and without a final evaluation (the experiment scores versions itself)."""
    cfg = copy.deepcopy(fm_cfg)
    cfg.data.train = ",".join(train_parts)
    cfg.data.eval = eval_part
    cfg.train.final_eval = False
    cfg.train.progress = False
    return cfg


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
        cfg = _version_config(fm_cfg, parts[:k], parts[k])
        train(cfg, vdir, data_dir, resume=reuse, force=not reuse)  # resume=True on an empty folder: fresh
        tt = max_ts([f for p in parts[:k] for f in ds.files(p)], ds.schema.time_column)
        write_manifest(vdir, k, tt, partitions=list(parts[:k]), mode="scratch")
    return list_versions(run)


def train_warm_versions(fm_cfg: Any, data_dir: str | Path, run: str | Path, partitions: list[str],
                        ks: list[int]) -> list[FMVersion]:
    """Versions ``ks`` (ascending) as one continuous training: version ``ks[i]`` trains on
    ``partitions[ks[i-1]:ks[i]]`` (the first on ``partitions[:ks[0]]``, from initialisation), starting from
    version ``ks[i-1]``'s final checkpoint, loaded with ``checkpoint.load`` into the trainer's model,
    optimizers and lr schedule exactly as ``--resume`` loads one (and the online trainer its newest version),
    so the step counter and schedule run on. Each version runs ``fm_cfg.train.epochs`` epochs over its new
    partitions; ``fm_cfg.train.steps`` must be 0 (a step budget has no meaning per version).

    Why not equal to scratch versions: a warm version has seen its oldest partitions the longest ago and
    its newest last (recency, as in production), and never revisits old partitions.

    Resumable: a published version (its manifest exists) is kept when it was trained warm from the same
    predecessor on the same partitions (else VersionError: a run folder of another mode); a version folder
    without a manifest (interrupted) resumes from its own newest checkpoint, or starts again from its
    predecessor when it saved none. The manifest's ``trained_through_ts`` is the newest ts of every
    partition of the chain (``partitions``), ``new_partitions`` this version's own.
    """
    if fm_cfg.train.steps:
        raise VersionError("warm FM versions train fm.train.epochs epochs over each version's new "
                           f"partitions; fm.train.steps = {fm_cfg.train.steps} must be 0")
    if not ks or ks != sorted(set(ks)) or ks[0] < 1 or ks[-1] >= len(partitions):
        raise VersionError(f"warm versions {ks}: need ascending version numbers in 1..{len(partitions) - 1} "
                           f"(a version k trains on the first k of {len(partitions)} partitions)")
    ds = Dataset(data_dir)
    prev: FMVersion | None = None
    for k in ks:
        start = prev.version if prev is not None else 0
        chain, new = list(partitions[:k]), list(partitions[start:k])
        vdir = version_dir(run, k)
        if (vdir / "manifest.json").exists():
            have = read_version(run, k)
            want = (prev.version if prev is not None else None, tuple(chain), tuple(new))
            if have.mode != "warm" or (have.init_from, have.partitions, have.new_partitions) != want:
                raise VersionError(f"{vdir}: published as a {have.mode} version (from {have.init_from}, new "
                                   f"{list(have.new_partitions)}), not as warm version {k} from {want[0]} on "
                                   f"{new}; use a fresh run folder")
            prev = have
            continue
        cfg = _version_config(fm_cfg, new, partitions[k])
        with Trainer(cfg, vdir, data_dir, resume=True) as trainer:  # resume: its own interrupted run
            if trainer.resumed is None and prev is not None:
                o = trainer.optimizers
                meta = ckpt.load(ckpt.latest_checkpoint(prev.path), trainer.model, dense_opt=o.dense_opt,
                                 sparse_opt=o.sparse, scheduler=o.scheduler)
                trainer.step = int(meta["step"])  # epochs, examples and losses count this version's own
            trainer.fit()
        tt = max_ts([f for p in chain for f in ds.files(p)], ds.schema.time_column)
        write_manifest(vdir, k, tt, partitions=chain, mode="warm", new_partitions=new,
                       init_from=prev.version if prev is not None else None)
        prev = read_version(run, k)
    return list_versions(run)
