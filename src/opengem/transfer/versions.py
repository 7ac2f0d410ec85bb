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
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from opengem.data.dataset import Dataset
from opengem.train import checkpoint as ckpt
from opengem.train.published import (  # the layout and its reading live beside evaluation (no trainer import)
    VERSION_NAME,
    VERSIONS,
    FMVersion,
    VersionError,
    list_versions,
    parse_fm_spec,
    read_version,
    version_dir,
    write_manifest,
)
from opengem.train.run_dir import saved_config_changes, shown_changes
from opengem.train.trainer import Trainer, train

__all__ = ["VERSION_NAME", "VERSIONS", "FMVersion", "VersionError", "list_versions", "parse_fm_spec",
           "read_version", "version_dir", "write_manifest"]

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


# a published version is a finished training: how long it trained is part of what it is (a resumed run may
# change these, a reused version may not)
_TRAINING_LENGTH = frozenset({"train.epochs", "train.steps"})


def _check_reused(vdir: Path, cfg: Any, data_dir: str | Path) -> None:
    """A published version is reused only when it was trained with the config it would be trained with now
    (an experiment re-run into the same folder with another FM recipe, or another training length, kept the
    old versions, silently)."""
    want = copy.deepcopy(cfg)
    want.data.path = str(Path(data_dir).resolve())
    changes = saved_config_changes(vdir, want, counted=_TRAINING_LENGTH)
    if changes:
        raise VersionError(f"{vdir}: published by an FM trained with another config "
                           f"({shown_changes(changes)}); the versions here are reused only as they were "
                           "trained: choose another output folder")


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
        cfg = _version_config(fm_cfg, parts[:k], parts[k])
        if reuse and (vdir / "manifest.json").exists():
            _check_reused(vdir, cfg, data_dir)
            continue
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
            _check_reused(vdir, _version_config(fm_cfg, new, partitions[k]), data_dir)
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
