"""Which finished run a study may reuse: one trained under the same resolved config.

A study (iso-FLOP, ablation, the size sweep) is resumed, extended and re-summarised many times over sessions;
retraining a run whose config has not changed wastes hours, and reusing one whose config has changed
reports a different model. The identity is a hash over every field of the resolved config, with one
tolerance: a knob added to the code since the run was trained (absent from the config the run wrote, so it
reads as its default, which by the project's rule is the old behaviour) does not change it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from opengem.config import ConfigError, load_config, to_dict


def config_sha256(rc: Any) -> str:
    """The identity of a resolved run config: a run's result is reused only under the same one."""
    return hashlib.sha256(json.dumps(to_dict(rc), sort_keys=True, default=str).encode()).hexdigest()


def same_config_as_written(rc: Any, run_dir: Path) -> bool:
    """Whether RUN/config.toml, the resolved config the run wrote, read with today's config classes, is
    ``rc``. A knob added to the code since the run was trained is missing from the file and reads as its
    default, so results survive an upgrade that only adds knobs (their hash, taken over every field, does
    not); a value that differs, or a file that no longer reads (a knob removed), does not match."""
    path = run_dir / "config.toml"
    if not path.is_file():
        return False
    try:
        written = load_config(type(rc), path)
    except (ConfigError, OSError, ValueError):
        return False
    return config_sha256(written) == config_sha256(rc)


def is_same_run(rc: Any, run_dir: Path, recorded_sha256: str | None) -> bool:
    """A finished run in ``run_dir`` (its result recorded under ``recorded_sha256``) is the run of ``rc``."""
    return recorded_sha256 == config_sha256(rc) or same_config_as_written(rc, run_dir)
