"""Where a run executes: its device and CPU threads (process groups: ``distributed.process_group``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from opengem.errors import TrainError


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
