"""What an FM run is, read as the FM -> VM commands read it (distill, generate): its versions.

An FM run is either an ``opengem train`` run (RUN/config.toml + RUN/checkpoints) or a run with published
versions (RUN/versions/vNNNN, from ``opengem train --online``). ``RUN@N`` pins version N. A batch-trained
run without versions is one version, 0: its evaluation checkpoint (early stopping's best, else the newest),
trained through the newest ts of its ``data.train`` partitions. Apart from ``distill_sources`` (which imports
``generate``) so that ``generate`` reads a batch-trained run the same way.
"""

from __future__ import annotations

import sys
from pathlib import Path

from opengem.data.dataset import Dataset
from opengem.data.schema import FeatureSchema
from opengem.errors import DatasetError, UsageError
from opengem.train.config import load_run_config
from opengem.train.evaluate import run_checkpoint
from opengem.train.run_dir import run_in_use
from opengem.transfer.versions import VERSIONS, FMVersion, VersionError, list_versions, max_ts, parse_fm_spec


class FMRunError(UsageError):
    """``--fm`` (or ``distill.hierarchical``) does not name a usable FM run."""


def fm_versions(spec: str, what: str = "--fm") -> tuple[Path, list[FMVersion]]:
    """(run folder, the versions to choose from) for ``RUN`` or ``RUN@N``; see the module docstring."""
    run, pinned = parse_fm_spec(spec)
    if not run.is_dir():
        raise FMRunError(f"{what} {spec}: no such FM run folder")
    published = (run / VERSIONS).is_dir()
    if pinned is not None or published:
        versions = list_versions(run)
        if pinned is None:
            return run, versions
        chosen = [v for v in versions if v.version == pinned]
        if not chosen:
            raise VersionError(f"{what} {spec}: no version {pinned} under {run / VERSIONS} (have: "
                               f"{', '.join(str(v.version) for v in versions)})")
        return run, chosen
    if not (run / "config.toml").exists():
        raise FMRunError(f"{what} {spec}: not an FM run (no config.toml and no {VERSIONS}/): train one with "
                         "`opengem train` first")
    cfg = load_run_config(run / "config.toml")
    try:
        fm_data = Dataset(cfg.data.path)
        through = max_ts(fm_data.files(cfg.data.train), fm_data.schema.time_column)
    except (DatasetError, VersionError) as e:
        raise FMRunError(f"{what} {spec}: cannot tell which rows the FM trained on (its data.train "
                         f"{cfg.data.train!r} in {cfg.data.path}): {e}") from None
    path, _ = run_checkpoint(run)
    holder = run_in_use(run)
    if holder:  # its newest checkpoint now is a mid-training one, and will not stay the newest
        print(f"opengem: warning: {what} {spec} is still training ({holder}): its checkpoint {path.name} is "
              "the teacher; a --resume after it has moved on is refused", file=sys.stderr, flush=True)
    return run, [FMVersion(0, through, path, tuple(fm_data.select(cfg.data.train)))]


def fm_schema(run: Path) -> FeatureSchema | None:
    """The schema the FM run trained on (its dataset's), None when that dataset is gone."""
    cfg_path = run / "config.toml"
    if not cfg_path.exists():
        return None
    try:
        return Dataset(load_run_config(cfg_path).data.path).schema
    except (DatasetError, OSError):
        return None
