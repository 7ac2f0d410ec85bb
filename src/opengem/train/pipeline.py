"""``train.pipeline = "sparse_dist"``: TorchRec's ``TrainPipelineSparseDist`` inside the one Trainer's loop.

What it overlaps: while batch i runs forward, backward and the optimizer, batch i+1 is already copied to
the device (a side stream on GPU, pinned memory) and its pooled tables' input all-to-all (the KJT's ids and
lengths to the ranks that own the rows) is in flight; the lookups then wait only for what is left of it.

How it finds the tables: TorchRec FX-traces the model to find each sharded module called on an attribute
of the batch. opengem's models validate their inputs and bucket sequences in Python, which FX cannot trace,
so the pipeline traces a :class:`LookupView` instead: a module whose forward calls each sharded pooled table
(``FeatureEmbedding.ebc``) on ``batch.sparse``, which is what the real forward passes it
(``FeatureEmbedding.ebc_takes_whole_batch``, set when the tables are sharded). TorchRec then swaps those
modules' ``forward`` for one that returns the prefetched lookup, so the real model, called as usual,
gets it. Sequence tables (EmbeddingCollections fed a KJT the forward builds from the histories) are not
pipelined: they keep their own input all-to-all inside the forward.

The step itself is the house step (``opengem.train.step``): TorchRec's pipeline calls ``zero_grad``,
the model's loss, backward and ``step`` in that order; :class:`DenseStep` is the optimizer it calls, whose
``step`` is :func:`opengem.train.step.dense_step` (gradient scaling, clipping, AdamW, the schedule). The
fused sparse optimizer steps inside backward, as without the pipeline.

Exact resume: the pipeline reads up to two batches ahead of the one it trains, so the loader position
saved with a checkpoint is the one recorded when the trained batch was read (:class:`PositionedBatches`),
not the loader's current one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.distributed.types import ShardedModule

from opengem.data.batch import Batch
from opengem.errors import TrainError
from opengem.model.embedding import FeatureEmbedding


class LookupView(nn.Module):
    """The graph TorchRec traces: every sharded pooled table called on ``batch.sparse`` (see module doc)."""

    def __init__(self, tables: list[nn.Module]) -> None:
        super().__init__()
        self.tables = nn.ModuleList(tables)

    def forward(self, batch: Batch) -> list[Any]:
        return [table(batch.sparse) for table in self.tables]


def pipelined_tables(model: nn.Module) -> list[nn.Module]:
    """The sharded pooled tables the pipeline can prefetch (each FeatureEmbedding's sharded ``ebc``)."""
    return [m.ebc for m in model.modules() if isinstance(m, FeatureEmbedding)
            and m.ebc_takes_whole_batch and isinstance(m.ebc, ShardedModule)]


class DenseStep:
    """The optimizer TorchRec's pipeline steps: ``zero_grad`` before the forward, ``step`` after backward."""

    def __init__(self, zero_grad: Callable[[], None], step: Callable[[], None]) -> None:
        self.zero_grad, self._step = zero_grad, step

    def step(self) -> None:
        self._step()


class PositionedBatches:
    """The loader's batches, each remembered with the loader position just after it (in read order).

    ``pin``: hand the pipeline page-locked batches, so that its copy to the GPU on the side stream is a DMA
    that does not block the host (a pageable one is staged synchronously; see ``Batch.to_device``)."""

    def __init__(self, batches: Iterable[Batch], position: Callable[[], dict[str, Any]], pin: bool = False
                 ) -> None:
        self._batches, self._position, self._pin = iter(batches), position, pin
        self._positions: deque[dict[str, Any]] = deque()

    def __iter__(self) -> Iterator[Batch]:
        for batch in self._batches:
            self._positions.append(self._position())
            yield batch.pinned() if self._pin else batch

    def trained(self) -> dict[str, Any]:
        """The position after the oldest batch read and not yet accounted for (the one just trained)."""
        return self._positions.popleft()


class SparseDistPipeline:
    """One ``TrainPipelineSparseDist`` for a Trainer's whole ``fit`` (kept across epochs).

    ``loss_fn(batch)`` returns the step's loss (label loss plus extras, scaled for the ranks);
    ``zero_grad`` and ``step`` are the dense optimizer's halves of the house step.
    """

    def __init__(self, model: nn.Module, device: torch.device, loss_fn: Callable[[Batch], torch.Tensor],
                 zero_grad: Callable[[], None], step: Callable[[], None]) -> None:
        tables = pipelined_tables(model)
        if not tables:
            raise TrainError("train.pipeline = 'sparse_dist': the model has no sharded pooled embedding "
                             "tables (EmbeddingBagCollection) to prefetch; use train.pipeline = 'none'")
        self.view = LookupView(tables)
        self.schema_keys = next(m.schema.sparse_names for m in model.modules()
                                if isinstance(m, FeatureEmbedding))
        self._loss_fn = loss_fn
        self.last_batch: Batch | None = None
        self.last_loss: torch.Tensor | None = None
        self._pipeline = TrainPipelineSparseDist(self.view, DenseStep(zero_grad, step), device,
                                                 execute_all_batches=True, custom_model_fwd=self._forward)
        self._checked = False

    def _forward(self, batch: Batch | None) -> tuple[torch.Tensor, torch.Tensor]:
        assert batch is not None
        if not self._checked:  # what the traced view reads must be what the real forward passes
            keys = list(batch.sparse.keys())
            if keys != list(self.schema_keys):
                raise TrainError(f"train.pipeline = 'sparse_dist': the batch's sparse keys {keys} are not in "
                                 f"the schema's order {list(self.schema_keys)}; use train.pipeline = 'none'")
            self._checked = True
        loss = self._loss_fn(batch)
        self.last_batch, self.last_loss = batch, loss
        return loss, loss.detach()

    def step(self, batches: Iterator[Batch]) -> bool:
        """Train on the next batch; False when ``batches`` and the pipeline are both empty."""
        self.view.train()
        try:
            self._pipeline.progress(batches)
        except StopIteration:
            return False
        return True

    def detach(self) -> None:
        """Give the tables their own forward back (evaluation, export); the next ``step`` re-attaches."""
        self._pipeline.detach()

    def reset(self) -> None:
        """Drop batches read ahead (a loop that stops early); the tables get their own forward back."""
        self._pipeline.detach()
        self._pipeline.reset()
