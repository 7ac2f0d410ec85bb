"""Batch.to_device: pinned and non-blocking host-to-GPU copies, a plain move everywhere else."""

from pathlib import Path

import torch

from opengem.data.batch import Batch
from opengem.data.random_batch import random_batch
from opengem.data.schema import FeatureSchema

TINY = Path(__file__).resolve().parents[1] / "configs" / "schemas" / "tiny.toml"


def test_to_device_on_cpu_is_a_plain_move():
    b = random_batch(FeatureSchema.load(TINY), 5, seed=0)
    moved = b.to_device("cpu")
    assert torch.equal(moved.dense, b.dense) and torch.equal(moved.surface, b.surface)
    assert torch.equal(moved.sparse.values(), b.sparse.values())


def test_to_device_pins_then_copies_without_blocking_to_a_gpu(monkeypatch):
    """The GPU path, checked on CPU: the host batch is pinned once and moved with non_blocking=True."""
    b = random_batch(FeatureSchema.load(TINY), 3, seed=0)
    calls = []
    monkeypatch.setattr(Batch, "pin_memory", lambda self: calls.append("pin") or self)
    monkeypatch.setattr(Batch, "to", lambda self, device, non_blocking=False: calls.append(
        (torch.device(device).type, non_blocking)) or self)
    b.to_device(torch.device("cuda", 0))
    assert calls == ["pin", ("cuda", True)]
    calls.clear()
    b.to_device("cpu")
    assert calls == [("cpu", False)]
