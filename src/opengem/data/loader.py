"""ParquetLoader: streams canonical Parquet into Batches, sharded and resumable exactly once.

The unit of work is one row group of one file. Units are ordered (files as given, row groups in file
order, optionally permuted by ``seed`` and the epoch), dealt round-robin to ranks, and each rank's units
round-robin to its DataLoader workers. A worker decodes one row group in pieces of ``read_rows`` rows
(memory: one piece plus one pending batch plus the DataLoader's prefetch, whatever row-group size the
writer chose), checks each piece (see ``parquet.py`` for the bad-input policies) and cuts batches of
exactly ``batch_size`` that may span units; only the last batch of each worker's stream may be smaller.

Position. Every batch travels with the per-unit row offsets it completes ("rows 0..k of unit u have been
delivered"); the loader applies them only when the batch is handed to the consumer, so ``state_dict()``
counts what the consumer received, never what workers prefetched. Offsets are keyed by (file, row group),
not by rank or worker, so a saved state resumes exactly once under any worker count, and under any world
size when the ranks' states are merged with :func:`merge_states`. Problem counts come back the same way.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch.utils.data as tud

from opengem.data.batch import Batch
from opengem.data.dataset import Dataset
from opengem.data.parquet import (
    Columns,
    DataError,
    FileInfo,
    ProblemLog,
    check_columns,
    effective_on_error,
    inspect_file,
    iter_row_group,
    to_batch,
)
from opengem.data.schema import FeatureSchema

STATE_VERSION = 1


@dataclass(frozen=True)
class Unit:
    info: FileInfo
    rg: int
    row_start: int  # first row of the row group within the file
    num_rows: int

    @property
    def key(self) -> str:
        return f"{self.info.path}#{self.rg}"


def merge_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One state from every rank's state (offsets are disjoint per unit; the furthest wins)."""
    if not states:
        raise ValueError("merge_states: no states")
    epochs = {s["epoch"] for s in states}
    if len(epochs) != 1:
        raise ValueError(f"merge_states: ranks are in different epochs {sorted(epochs)}")
    offsets: dict[str, int] = {}
    for s in states:
        for k, v in s["offsets"].items():
            offsets[k] = max(v, offsets.get(k, 0))
    return {"version": STATE_VERSION, "epoch": epochs.pop(), "offsets": offsets}


class _Stream(tud.IterableDataset):
    """One rank's units for one pass; yields (batch | None, offsets, problem counts, samples, error)."""

    def __init__(self, schema: FeatureSchema, units: list[Unit], offsets: dict[str, int], batch_size: int,
                 drop_last: bool, on_error: str, keep: int, read_rows: int) -> None:
        self.schema, self.units, self.offsets, self.read_rows = schema, units, offsets, read_rows
        self.batch_size, self.drop_last, self.on_error, self.keep = batch_size, drop_last, on_error, keep

    def __iter__(self) -> Iterator[tuple]:
        info = tud.get_worker_info()
        units = self.units if info is None else self.units[info.id::info.num_workers]
        log = ProblemLog(raise_errors=True, keep=self.keep)
        pending: list[Columns] = []
        pending_n = 0
        updates: dict[str, int] = {}
        pending_keys: set[str] = set()

        def make(parts: list[Columns]) -> Batch | Columns:
            # In a worker, ship numpy (pickled through the pipe in one piece per array) and build the
            # Batch in the consumer: torch's per-tensor shared-memory hand-off costs more than the copy.
            cols = Columns.concat(parts)
            if info is None:
                return to_batch(cols, self.schema)
            return Columns(cols.n, cols.scalars, cols.masks, cols.lists, cols.rows)  # no slice cache

        def emit(batch: Batch | Columns | None, upd: dict[str, int]) -> tuple:
            out = (batch, upd, dict(log.counts), list(log.samples), None)
            log.counts.clear()
            log.samples.clear()
            return out

        try:
            for u in units:
                start = self.offsets.get(u.key, 0)
                if start >= u.num_rows:
                    continue
                try:
                    for table, first in iter_row_group(u.info, u.rg, self.schema, start, self.read_rows):
                        last_piece = first + table.num_rows == u.num_rows
                        cols = Columns.from_arrow(table, self.schema, u.row_start + first)
                        cols = check_columns(cols, self.schema, u.info.path, log, self.on_error)
                        if cols.n == 0 and last_piece:
                            updates[u.key] = u.num_rows
                        pos = 0
                        while pos < cols.n:
                            take = min(self.batch_size - pending_n, cols.n - pos)
                            part = cols.slice(pos, pos + take)
                            pos += take
                            pending.append(part)
                            pending_n += take
                            pending_keys.add(u.key)
                            done = last_piece and pos == cols.n
                            updates[u.key] = u.num_rows if done else int(part.rows[-1]) - u.row_start + 1
                            if pending_n == self.batch_size:
                                yield emit(make(pending), updates)
                                pending, pending_n, updates, pending_keys = [], 0, {}, set()
                except DataError as e:
                    if self.on_error != "skip":
                        raise
                    what = "corrupt row group" if e.what.startswith("corrupt") else e.what
                    log.add(e.file, e.column, what, "skip", None if e.row is None else np.array([e.row]))
                    updates[u.key] = u.num_rows
            if pending_n and not self.drop_last:
                yield emit(make(pending), updates)
            else:
                # Rows of a dropped last batch were never delivered: leave their units' offsets alone.
                yield emit(None, {k: v for k, v in updates.items() if k not in pending_keys})
        except DataError as e:
            # Sent as data rather than raised so the message reaches the caller without a worker traceback.
            yield (None, {}, dict(log.counts), list(log.samples), (e.file, e.what, e.column, e.row))


class ParquetLoader:
    """Iterable of :class:`Batch` over canonical Parquet files; see the module docstring.

    ``files``: Parquet paths, or one dataset folder (all partitions). ``read_rows``: rows decoded at a
    time within a row group (the memory bound). ``on_error``: None follows the schema, ``"skip"``
    turns every ``error`` policy into skip-and-count. ``problems`` accumulates the counts of everything
    skipped or repaired; ``report()`` formats them. Iterating again after a complete pass starts
    the next epoch (with ``shuffle_units`` a new unit order).
    """

    def __init__(self, files: Sequence[str | Path] | str | Path, schema: FeatureSchema, batch_size: int, *,
                 rank: int = 0, world_size: int = 1, num_workers: int = 0, on_error: str | None = None,
                 drop_last: bool = False, shuffle_units: bool = False, seed: int = 0,
                 keep_problems: int = 100, read_rows: int = 8192) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if isinstance(files, (str, Path)):
            files = Dataset(files, schema).files() if Path(files).is_dir() else [files]
        self.files = [str(f) for f in files]
        if not self.files:
            raise ValueError("ParquetLoader: no files")
        self.schema = schema
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.num_workers, self.drop_last = num_workers, drop_last
        self.shuffle_units, self.seed = shuffle_units, seed
        self.read_rows = read_rows
        self.on_error = effective_on_error(schema, on_error)
        self.problems = ProblemLog(raise_errors=True, keep=keep_problems)
        self.epoch = 0
        self._offsets: dict[str, int] = {}
        self._infos: list[FileInfo] = []
        for f in self.files:
            try:
                self._infos.append(inspect_file(f, schema))
            except DataError as e:
                if self.on_error != "skip":
                    raise
                self.problems.add(e.file, e.column, e.what, "skip")

    # ------------------------------------------------------------------ units and position
    def all_units(self) -> list[Unit]:
        """Every rank's units in this epoch's order."""
        units = []
        for info in self._infos:
            start = 0
            for rg, n in enumerate(info.row_groups):
                if n:
                    units.append(Unit(info, rg, start, n))
                start += n
        if self.shuffle_units:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(len(units))
            units = [units[i] for i in order]
        return units

    def units(self) -> list[Unit]:
        return self.all_units()[self.rank::self.world_size]

    @property
    def num_rows(self) -> int:
        """Rows this rank reads in one epoch before any are dropped as bad."""
        return sum(u.num_rows for u in self.units())

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "epoch": self.epoch, "offsets": dict(self._offsets)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"loader state version {state.get('version')!r}, expected {STATE_VERSION}")
        self.epoch = int(state["epoch"])
        self._offsets = {str(k): int(v) for k, v in state["offsets"].items()}

    def report(self) -> str:
        return self.problems.report()

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[Batch]:
        stream = _Stream(self.schema, self.units(), dict(self._offsets), self.batch_size, self.drop_last,
                         self.on_error, self.problems.keep, self.read_rows)
        if self.num_workers == 0:
            items: Any = iter(stream)
        else:
            items = iter(tud.DataLoader(stream, batch_size=None, num_workers=self.num_workers,
                                        collate_fn=_identity))
        for batch, updates, counts, samples, error in items:
            for k, v in updates.items():
                self._offsets[k] = max(v, self._offsets.get(k, 0))
            self.problems.merge(counts, samples)
            if error is not None:
                file, what, column, row = error
                raise DataError(file, what, column, row)
            if batch is not None:
                yield batch if isinstance(batch, Batch) else to_batch(batch, self.schema)
        self.epoch += 1
        self._offsets = {}


def _identity(x: Any) -> Any:
    return x
