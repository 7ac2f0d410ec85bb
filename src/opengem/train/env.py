"""Where a run executes: its device, CPU threads and opengem's per-machine cache folder (process groups:
``distributed.process_group``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from opengem.errors import TrainError


def cache_dir() -> Path:
    """opengem's folder in the user's cache (``$XDG_CACHE_HOME`` or ``~/.cache``): what is worth keeping
    between runs on one machine (compiled kernels, the ``train.cpu_linear`` probe)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "opengem"


def resolve_device(name: str) -> torch.device:
    """``auto`` | ``cpu`` | ``cuda`` -> a device; CUDA gets an index (set_device and DMP need one)."""
    if name == "cuda" and not torch.cuda.is_available():
        raise TrainError("train.device = 'cuda' but no CUDA device is available (use 'auto' or 'cpu')")
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))


@contextlib.contextmanager
def cpu_threads(n: int) -> Iterator[None]:
    """Run with n intra-op threads (0 = unchanged) and restore: tiny models lose time to OpenMP sync."""
    old = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
