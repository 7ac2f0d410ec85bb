"""A pool of real batches cycled through ``Trainer.train_step`` and timed, for the paired step benchmarks.

Paired benchmarks (``cpu_linear_ab.py``, ``gem_seq_buckets.py``) switch one thing on the same weights between
interleaved windows of steps; each window is timed here in the main thread's CPU time (``time.thread_time``),
which other processes on a shared machine do not inflate.
"""

from __future__ import annotations

import time

from opengem.data.batch import Batch
from opengem.train.trainer import Trainer


class StepPool:
    """``size`` batches from the trainer's loader, moved to its device once, then trained on in turn."""

    def __init__(self, trainer: Trainer, size: int) -> None:
        loader = iter(trainer.train_loader())
        self.trainer = trainer
        self.batches: list[Batch] = [next(loader).to(trainer.device) for _ in range(size)]
        self._next = 0

    def cpu_s_per_step(self, n: int) -> float:
        """Train ``n`` steps on the next batches of the pool; main-thread CPU seconds per step."""
        t = time.thread_time()
        for _ in range(n):
            self.trainer.train_step(self.batches[self._next % len(self.batches)])
            self._next += 1
        return (time.thread_time() - t) / n
