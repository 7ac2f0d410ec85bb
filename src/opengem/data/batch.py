"""Batch: one training step's worth of examples, moved to a device as one unit.

Sequences stay jagged (values + offsets) all the way to the model: padding is a model-side choice,
never a storage format, so a 2,000-event history costs memory only where it exists.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from torchrec.streamable import Pipelineable

from opengem.ops.jagged import jagged_to_padded, keep_last_index, lengths_to_offsets, padding_mask

# Building a KeyedJaggedTensor goes through torch.fx's proxyable-class hook, whose first call logs a warning
# about torch's own is_fx_tracing API (meant for code calling it, not for us): without this, every process
# that makes a batch outside training (a Predictor, `opengem serve`) printed it once.
logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)


@dataclass
class SequenceBatch:
    """One sequence group for B rows: per-field flat values sharing ``lengths`` (oldest event first)."""

    lengths: torch.Tensor  # [B] int64
    ids: dict[str, torch.Tensor] = field(default_factory=dict)  # field -> [sum(lengths)] int64
    dense: dict[str, torch.Tensor] = field(default_factory=dict)  # field -> [sum(lengths)] float32

    @property
    def offsets(self) -> torch.Tensor:
        return lengths_to_offsets(self.lengths)

    @property
    def max_len(self) -> int:
        return int(self.lengths.max()) if self.lengths.numel() else 0

    def to(self, device: torch.device | str, non_blocking: bool = False) -> SequenceBatch:
        return SequenceBatch(
            lengths=self.lengths.to(device, non_blocking=non_blocking),
            ids={k: v.to(device, non_blocking=non_blocking) for k, v in self.ids.items()},
            dense={k: v.to(device, non_blocking=non_blocking) for k, v in self.dense.items()},
        )

    def recent(self, k: int) -> SequenceBatch:
        """The group with each row cut to its ``k`` most recent events (itself when no row is longer)."""
        if not self.lengths.numel() or int(self.lengths.max()) <= k:
            return self
        index, kept = keep_last_index(self.lengths, k)
        return SequenceBatch(lengths=kept, ids={f: v.index_select(0, index) for f, v in self.ids.items()},
                             dense={f: v.index_select(0, index) for f, v in self.dense.items()})

    def padded(self, name: str, max_len: int | None = None, pad_value: float = 0) -> torch.Tensor:
        """[B, L] dense view of one field (for reference implementations and tests)."""
        values = self.ids[name] if name in self.ids else self.dense[name]
        L = self.max_len if max_len is None else max_len
        if self.lengths.numel() and int(self.lengths.max()) > L:
            raise ValueError(f"padded: a row has {int(self.lengths.max())} events, more than {L}")
        return jagged_to_padded(values, self.lengths, L, pad_value)[0]

    def mask(self, max_len: int | None = None) -> torch.Tensor:
        """[B, L] bool, True where an event exists."""
        L = self.max_len if max_len is None else max_len
        return padding_mask(self.lengths, L)


@dataclass
class Batch(Pipelineable):
    """TorchRec's ``Pipelineable`` (``to`` and ``record_stream``): its train pipeline copies batches ahead
    on a side stream (opengem.train.pipeline)."""

    dense: torch.Tensor  # [B, Dd] float32
    sparse: KeyedJaggedTensor  # keys = schema sparse feature names
    sequences: dict[str, SequenceBatch]  # group name -> SequenceBatch
    labels: torch.Tensor  # [B, T] float32 (0 where unobserved)
    label_mask: torch.Tensor  # [B, T] bool, True where observed
    surface: torch.Tensor  # [B] int64
    example_id: torch.Tensor  # [B] int64
    ts: torch.Tensor  # [B] int64

    @property
    def batch_size(self) -> int:
        return int(self.surface.shape[0])

    def __len__(self) -> int:
        return self.batch_size

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(
            dense=self.dense.to(device, non_blocking=non_blocking),
            sparse=self.sparse.to(torch.device(device), non_blocking=non_blocking),
            sequences={k: v.to(device, non_blocking) for k, v in self.sequences.items()},
            labels=self.labels.to(device, non_blocking=non_blocking),
            label_mask=self.label_mask.to(device, non_blocking=non_blocking),
            surface=self.surface.to(device, non_blocking=non_blocking),
            example_id=self.example_id.to(device, non_blocking=non_blocking),
            ts=self.ts.to(device, non_blocking=non_blocking),
        )

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the batch but the KJT's."""
        seq = [t for v in self.sequences.values() for t in (v.lengths, *v.ids.values(), *v.dense.values())]
        return [self.dense, *seq, self.labels, self.label_mask, self.surface, self.example_id, self.ts]

    def record_stream(self, stream: torch.Stream) -> None:
        """Mark every tensor as used on ``stream`` (a batch copied on one stream and read on another)."""
        for t in self.tensors():
            t.record_stream(stream)  # type: ignore[arg-type]
        self.sparse.record_stream(stream)

    def to_device(self, device: torch.device | str) -> Batch:
        """The batch on ``device`` the fast way: to a GPU from page-locked memory without blocking the host.

        A pageable host tensor is copied to the GPU synchronously (through a staging buffer); a pinned one
        is copied by DMA, ordered on the current stream, while the host queues the step's kernels. A batch
        a loader already pinned is not pinned again. Everything else (CPU, a batch already on the GPU) is
        ``to(device)``. Only host-to-device copies are made non-blocking: the values are then read on the
        same stream, so they are never read early.
        """
        device = torch.device(device)
        if device.type != "cuda" or self.dense.device.type == "cuda":
            return self.to(device)
        return self.pinned().to(device, non_blocking=True)

    def pinned(self) -> Batch:
        """This batch in page-locked memory: itself when a loader already pinned it, else a pinned copy."""
        return self if self.dense.is_pinned() else self.pin_memory()

    def pin_memory(self) -> Batch:
        return Batch(
            dense=self.dense.pin_memory(),
            sparse=self.sparse.pin_memory(),
            sequences={
                k: SequenceBatch(
                    v.lengths.pin_memory(),
                    {f: t.pin_memory() for f, t in v.ids.items()},
                    {f: t.pin_memory() for f, t in v.dense.items()},
                )
                for k, v in self.sequences.items()
            },
            labels=self.labels.pin_memory(),
            label_mask=self.label_mask.pin_memory(),
            surface=self.surface.pin_memory(),
            example_id=self.example_id.pin_memory(),
            ts=self.ts.pin_memory(),
        )
