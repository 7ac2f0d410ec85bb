"""ParquetLoader: streams canonical Parquet into Batches, sharded and resumable exactly once.

The unit of work is one row group of one file, or a slice of its rows. Row groups are ordered (files as
given, row groups in file order, optionally permuted by ``seed`` and the epoch) and dealt to *streams*,
one per (rank, DataLoader worker): stream ``worker * world_size + rank``, so that a rank's streams are
its units as dealt round-robin to its workers. The deal (:func:`deal`) goes round by round, one row group
per stream: a round whose row groups all have the same number of rows is dealt whole, round-robin (then N
ranks with batch B see, step by step, the rows one rank sees with batch N*B); any other round, the last
one included, is split by rows into contiguous slices of equal size, so every stream gets the same number
of rows (+-1 per round, the larger shares rotating) and every rank has rows to read whenever the files
hold at least one row per stream, however few row groups they have. A worker decodes its units in pieces
of ``read_rows`` rows (memory: one piece plus one pending batch plus the DataLoader's prefetch, whatever
row-group size the writer chose), checks each piece (see ``parquet.py`` for the bad-input policies) and
cuts batches of exactly ``batch_size`` that may span units; only the last batch of each worker's stream
may be smaller.

Position. Every batch travels with the per-unit row offsets it completes ("rows 0..k of unit u have been
delivered"); the loader applies them only when the batch is handed to the consumer, so ``state_dict()``
counts what the consumer received, never what workers prefetched. An offset is keyed by the unit's first
row (``file#rg`` for a unit that starts the row group, ``file#rg@row`` for a slice starting at that row
of it), not by rank or worker: each entry says "rows row..row+k of this row group are delivered". A
resume reads, of each unit of its own deal, the rows no entry covers: the rest of the unit after its own
offset, or, when the state comes from another deal (another number of streams, e.g. ranks' states merged
with :func:`merge_states` and resumed on another world size), the unit's undelivered gaps as units of
their own. So a saved state resumes exactly once under any worker count and any world size. Problem
counts come back the same way.

Row mixing (``shuffle_window`` W >= 2). A row group is a contiguous slice of time, so reading units one
after another makes consecutive batches correlated. With W >= 2 each stream (one rank's, one worker's units
after the dealing above) is cut into consecutive windows of W units, and the rows of a window are
interleaved: the sequence of unit labels, each unit repeated ``num_rows`` times, is permuted by
``np.random.default_rng([seed, epoch, crc32(the window's unit keys)])`` (keys naming each file by its
partition folder and file name only, so the order does not depend on where the dataset lies) and position i
of the window takes the next row of unit ``labels[i]``, in file order. Each unit is still read lazily in
pieces of ``read_rows`` (memory: about W pieces plus a batch), bad rows are dropped after checking as
before, and an offset still counts the rows read from its unit, so "rows 0..k of unit u" stays valid: after
any batch the offsets of a window are the label counts of a prefix of its sequence. A resume recomputes the
sequence, skips sum(offsets) positions and checks that the prefix counts equal the offsets; it raises a
ValueError naming the unit when they do not (a state saved with another shuffle_window, seed or unit order).
The windows depend on the number of streams (world size x workers): when a state comes from another number
of streams (e.g. two ranks merged and resumed by one), a window whose offsets are not a prefix of its
sequence reads its units' remaining rows unit after unit instead (exactly once, unmixed, for that epoch's
few such windows); ``state_dict()`` records this so that later resumes accept it too.

``shuffle_window = -1`` (``PARTITION_WINDOW``) makes each run of consecutive units from one partition folder
(``day=NNN``) a window: with ``shuffle_units`` off, the days come in order and each day's rows are interleaved
across the whole day, as a model retrained on each new day's log reads them. Memory: one label per row of the
window and a decoded piece of each of its units, so a partition of more than ``PARTITION_WINDOW_MAX_UNITS``
row groups is refused when the loader is made (a DatasetError naming it).
"""

from __future__ import annotations

import collections
import itertools
import signal
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
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
from opengem.errors import DatasetError

STATE_VERSION = 2  # 2: offsets of units that start inside a row group (``file#rg@row``)
STATE_VERSIONS = (1, 2)  # readable: 1 has whole row groups only, a special case of 2


@dataclass(frozen=True)
class Unit:
    """Rows ``begin .. begin + num_rows`` of row group ``rg`` of a file (a whole row group: ``begin`` 0)."""

    info: FileInfo
    rg: int
    row_start: int  # first row of the row group within the file
    num_rows: int  # rows of this unit
    begin: int = 0  # first row of this unit within its row group

    @property
    def key(self) -> str:
        """The key of its offset: the row group, and the first row when the unit starts inside it."""
        base = f"{self.info.path}#{self.rg}"
        return base if self.begin == 0 else f"{base}@{self.begin}"

    @property
    def first_row(self) -> int:
        """The file row of the unit's first row."""
        return self.row_start + self.begin

    def part(self, start: int, num_rows: int) -> Unit:
        """Rows ``start .. start + num_rows`` of this unit, as a unit of their own."""
        return Unit(self.info, self.rg, self.row_start, num_rows, self.begin + start)


def spread_units(units: Sequence[Unit], rows: int) -> list[Unit]:
    """``rows`` rows taken as whole units spread evenly over ``units`` (in their order), the last one cut.

    Why: a partition's rows are in time order, so its first rows are its first minutes. A log's first
    quarter hour after midnight is the slice nearest the training days and not the day's mix (session 46:
    an iso-FLOP study that validated on a day's first 16,384 rows saw GEM 0.0055 NE ahead of DCNv2 where the
    whole day has them level). Whole units keep the cost of reading ``rows`` rows: a row group is decoded
    once, never for a slice of it. The units are cut into k equal runs and the middle unit of each is
    chosen (position ``floor((2i + 1) * len(units) / 2k)``), for the smallest k whose units hold ``rows``;
    all units when they hold fewer.
    """
    if rows <= 0 or not units:
        return list(units)
    n = len(units)
    for k in range(max(1, -(-rows // max(u.num_rows for u in units))), n + 1):
        chosen = [units[(2 * i + 1) * n // (2 * k)] for i in range(k)]
        if sum(u.num_rows for u in chosen) >= rows:
            break
    else:
        return list(units)
    out, left = [], rows
    for u in chosen:
        if left <= 0:
            break
        out.append(u if u.num_rows <= left else u.part(0, left))
        left -= u.num_rows
    return out


def deal(units: Sequence[Unit], streams: int) -> list[list[Unit]]:
    """Every stream's units for one pass, round by round (one unit per stream a round).

    A round of units of one size is dealt whole, round-robin: the layout of earlier versions, under
    which N ranks with batch B step through the same rows as one rank with batch N*B. Any other round
    (sizes differ, or the last round is short) is cut by rows into ``streams`` contiguous slices of equal
    size, the slice order rotating by round so that no stream collects the +1 remainders: every stream
    gets its share of the rows, and one with no rows exists only when the files hold fewer rows than
    there are streams. The layout depends only on the units, their order and ``streams``.
    """
    out: list[list[Unit]] = [[] for _ in range(streams)]
    for j, i in enumerate(range(0, len(units), streams)):
        rnd = list(units[i:i + streams])
        if len(rnd) == streams and len({u.num_rows for u in rnd}) == 1:
            for s, u in enumerate(rnd):
                out[s].append(u)
            continue
        total = sum(u.num_rows for u in rnd)
        bounds = [k * total // streams for k in range(streams + 1)]
        shift = j % streams
        pos = 0  # first row of the current unit within the round
        for u in rnd:
            for k in range(streams):
                lo, hi = max(bounds[k], pos), min(bounds[k + 1], pos + u.num_rows)
                if lo < hi:
                    out[(k + shift) % streams].append(u.part(lo - pos, hi - lo))
            pos += u.num_rows
    return out


def _parse_key(key: str) -> tuple[str, int, int]:
    """(file, row group, first row within it) of an offset key."""
    path, _, rest = key.rpartition("#")
    rg, _, begin = rest.partition("@")
    return path, int(rg), int(begin or 0)


def _delivered(offsets: dict[str, int]) -> dict[tuple[str, int], list[tuple[int, int]]]:
    """Per (file, row group): the delivered rows as sorted, merged [start, end) intervals."""
    spans: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for key, n in offsets.items():
        if n > 0:
            path, rg, begin = _parse_key(key)
            spans.setdefault((path, rg), []).append((begin, begin + n))
    for ivs in spans.values():
        ivs.sort()
        merged = [ivs[0]]
        for a, b in ivs[1:]:
            if a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        ivs[:] = merged
    return spans


def _resume(stream: list[Unit], offsets: dict[str, int],
            spans: dict[tuple[str, int], list[tuple[int, int]]]) -> tuple[list[Unit], dict[str, int], bool]:
    """A stream's units and start offsets under a saved position; True when it came from another deal.

    A unit whose delivered rows are a prefix of it keeps its place with that offset; one with delivered
    rows elsewhere (a position saved under another deal) is replaced by its undelivered gaps, each a unit
    read from its start. Exactly once either way.
    """
    units, starts, foreign = [], {}, False
    for u in stream:
        lo, hi = u.begin, u.begin + u.num_rows
        cover = [(max(a, lo), min(b, hi)) for a, b in spans.get((u.info.path, u.rg), ()) if a < hi and b > lo]
        if not cover:
            units.append(u)
            continue
        if cover[0][0] == lo and len(cover) == 1:
            units.append(u)
            starts[u.key] = cover[0][1] - lo
            foreign |= starts[u.key] != offsets.get(u.key, 0)
            continue
        foreign, at = True, lo
        for a, b in [*cover, (hi, hi)]:
            if a > at:
                units.append(u.part(at - lo, a - at))
            at = max(at, b)
    return units, starts, foreign


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
    out = {"version": STATE_VERSION, "epoch": epochs.pop(), "offsets": offsets}
    mixing = [s.get("shuffle") or {} for s in states]
    if any(mixing):
        kinds = {(m.get("window", 0), m.get("seed")) for m in mixing}
        if len(kinds) != 1:
            raise ValueError(f"merge_states: ranks mix rows differently (shuffle_window, seed): "
                             f"{sorted(kinds, key=str)}")
        window, seed = kinds.pop()
        streams = {m.get("streams") for m in mixing}
        out["shuffle"] = {"window": window, "seed": seed,
                          "streams": streams.pop() if len(streams) == 1 else None}
    return out


PARTITION_WINDOW = -1  # shuffle_window: one window per run of consecutive units of one partition folder
# A window holds a decoded piece of every unit at once, so a partition window is refused above this many units
# (at the default read_rows, ~2M rows in memory): a partition that large wants a positive shuffle_window.
PARTITION_WINDOW_MAX_UNITS = 256


def mixes(window: int) -> bool:
    """Whether ``shuffle_window`` interleaves rows: W >= 2 units, or a partition (``PARTITION_WINDOW``)."""
    return window >= 2 or window == PARTITION_WINDOW


def _partition(u: Unit) -> Path:
    return Path(u.info.path).parent


def _windows(units: list[Unit], window: int) -> list[list[Unit]]:
    if window == PARTITION_WINDOW:
        return [list(g) for _, g in itertools.groupby(units, key=_partition)]
    return [units[i:i + window] for i in range(0, len(units), window)]


def _window_labels(units: list[Unit], seed: int, epoch: int) -> np.ndarray:
    """The window's interleaving: unit index of each position, each unit ``num_rows`` times."""
    labels = np.repeat(np.arange(len(units), dtype=np.int8 if len(units) < 128 else np.int32),
                       [u.num_rows for u in units])
    key = zlib.crc32("\n".join(_mixing_key(u) for u in units).encode())
    return np.random.default_rng([seed, epoch, key]).permutation(labels)


def _mixing_key(u: Unit) -> str:
    """The unit's key with its file named by partition folder and file name only: the interleaving (and so
    every trained number) must not depend on where the dataset lies (a fresh clone, another --out)."""
    p = Path(u.info.path)
    base = f"{p.parent.name}/{p.name}#{u.rg}"
    return base if u.begin == 0 else f"{base}@{u.begin}"


def _window_start(units: list[Unit], offsets: list[int], labels: np.ndarray) -> tuple[int, int | None]:
    """(positions already delivered, index of the first unit whose offset is not the prefix's count)."""
    start = sum(offsets)
    counts = np.bincount(labels[:start], minlength=len(units))
    bad = np.flatnonzero(counts != np.asarray(offsets))
    return start, (int(bad[0]) if bad.size else None)


class _Cutter:
    """Cuts batches of exactly ``size`` rows from a stream of pieces, with the offsets each one completes.

    ``updates`` are the offsets that hold once everything fed so far is delivered; ``base`` those that
    held when the pending batch was begun; ``keys`` the units that the marks of its rows name (unit after
    unit: the units with rows in it).
    """

    def __init__(self, size: int) -> None:
        self.size, self.parts, self.n = size, [], 0
        self.updates: dict[str, int] = {}
        self.base: dict[str, int] = {}
        self.keys: set[str] = set()

    def feed(self, cols: Columns, mark: Any) -> Iterator[tuple[list[Columns], dict[str, int]]]:
        """``mark(j)``: the offsets that hold once rows 0..j of ``cols`` are delivered."""
        pos = 0
        while pos < cols.n:
            if self.n == 0:
                self.base = dict(self.updates)
            take = min(self.size - self.n, cols.n - pos)
            self.parts.append(cols.slice(pos, pos + take))
            self.n += take
            pos += take
            done = mark(pos - 1)
            self.updates.update(done)
            self.keys.update(done)
            if self.n == self.size:
                yield self.parts, self.updates
                self.parts, self.n, self.updates, self.keys = [], 0, {}, set()

    def dropped(self, mixed: bool) -> dict[str, int]:
        """The offsets that hold when the pending (last) batch is dropped: its rows were never delivered.

        Unit after unit, only the units with rows in it keep their earlier offsets (a unit completed
        meanwhile with no row in it, all bad or skipped, counts as done); with row mixing every offset stays
        as it was when the batch was begun, so that a window's offsets remain a prefix of its interleaving.
        """
        if not self.n:
            return self.updates
        return self.base if mixed else {k: v for k, v in self.updates.items() if k not in self.keys}


def _unit_pieces(u: Unit, schema: FeatureSchema, start: int,
                 read_rows: int) -> Iterator[tuple[pa.Table, int]]:
    """(table, first row within the unit) pieces of ``u`` from its row ``start`` on, up to its last row."""
    end = u.begin + u.num_rows
    pieces = iter_row_group(u.info, u.rg, schema, u.begin + start, read_rows)
    try:
        for table, first in pieces:
            if first >= end:
                break
            if first + table.num_rows > end:
                table = table.slice(0, end - first)
            yield table, first - u.begin
            if first + table.num_rows >= end:
                break
    finally:
        pieces.close()  # type: ignore[attr-defined]


def _skipped(e: DataError, on_error: str, log: ProblemLog) -> None:
    """Count a unit's DataError as skipped (its remaining rows deliver nothing); raise it unless skipping."""
    if on_error != "skip":
        raise e
    what = "corrupt row group" if e.what.startswith("corrupt") else e.what
    log.add(e.file, e.column, what, "skip", None if e.row is None else np.array([e.row]))


class _UnitReader:
    """One unit of a window, read lazily in pieces from ``start``; ``take(n)`` consumes n file positions."""

    def __init__(self, stream: _Stream, unit: Unit, start: int, log: ProblemLog) -> None:
        self.stream, self.unit, self.log = stream, unit, log
        self.cursor = self.read_to = start  # positions consumed / positions read from the file
        self.pieces: Iterator[tuple[Any, int]] | None = None
        self.piece: Columns | None = None
        self.rel = np.zeros(0, dtype=np.int64)  # the piece's row positions within the unit
        self.at = 0  # rows of the piece consumed
        self.dead = False

    def take(self, n: int) -> list[Columns]:
        """The checked rows among the next ``n`` positions of the unit, in file order."""
        s, u, end, out = self.stream, self.unit, self.cursor + n, []
        while True:
            if self.piece is not None:
                k = int(np.searchsorted(self.rel, end))
                if k > self.at:
                    out.append(self.piece.slice(self.at, k))
                    self.at = k
                if self.at < self.piece.n:
                    break
                self.piece = None
            if self.read_to >= end or self.dead:
                break
            if self.pieces is None:
                self.pieces = _unit_pieces(u, s.schema, self.cursor, s.read_rows)
            try:
                table, first = next(self.pieces)
                cols = Columns.from_arrow(table, s.schema, u.first_row + first)
                self.piece = check_columns(cols, s.schema, u.info.path, self.log, s.on_error)
            except StopIteration:
                self.dead = True
                break
            except DataError as e:
                _skipped(e, s.on_error, self.log)
                self.dead = True  # its remaining positions deliver nothing
                break
            self.rel, self.at = self.piece.rows - u.first_row, 0
            self.read_to = first + table.num_rows
        self.cursor = end
        return out

    def close(self) -> None:
        if self.pieces is not None:
            self.pieces.close()  # type: ignore[attr-defined]
        self.piece = None


class _Stream(tud.IterableDataset):
    """One rank's units for one pass, one list per worker (one list without workers); yields
    (batch | None, offsets, problem counts, samples, error)."""

    def __init__(self, schema: FeatureSchema, streams: list[list[Unit]], offsets: dict[str, int],
                 batch_size: int, drop_last: bool, on_error: str, keep: int, read_rows: int, window: int = 0,
                 seed: int = 0, epoch: int = 0, lenient: bool = False, tensors: bool = True) -> None:
        self.schema, self.streams, self.offsets, self.read_rows = schema, streams, offsets, read_rows
        self.tensors = tensors  # False: yield Columns, never Batches (ParquetLoader.skip drops them anyway)
        self.batch_size, self.drop_last, self.on_error, self.keep = batch_size, drop_last, on_error, keep
        # Row mixing: windows of `window` units; `lenient`: a window whose offsets are not a prefix of its
        # interleaving (state from another number of streams) is read unit after unit.
        self.window, self.seed, self.epoch, self.lenient = window, seed, epoch, lenient

    def __iter__(self) -> Iterator[tuple]:
        info = tud.get_worker_info()
        units = self.streams[0 if info is None else info.id]
        log = ProblemLog(raise_errors=True, keep=self.keep)
        cut = _Cutter(self.batch_size)

        def emit(parts: list[Columns] | None, upd: dict[str, int]) -> tuple:
            batch: Batch | Columns | None = None
            if parts:
                # In a worker, ship numpy (pickled through the pipe in one piece per array) and build the
                # Batch in the consumer: torch's per-tensor shared-memory hand-off costs more than the copy.
                cols = Columns.concat(parts)
                batch = to_batch(cols, self.schema) if info is None and self.tensors \
                    else Columns(cols.n, cols.scalars, cols.masks, cols.lists, cols.rows)  # no slice cache
            out = (batch, upd, dict(log.counts), list(log.samples), None)
            log.counts.clear()
            log.samples.clear()
            return out

        try:
            mixed = mixes(self.window)
            for parts, upd in self._mixed(units, cut, log) if mixed else self._plain(units, cut, log):
                yield emit(parts, upd)
            if cut.n and not self.drop_last:
                yield emit(cut.parts, cut.updates)
            else:
                yield emit(None, cut.dropped(mixed))
        except DataError as e:
            # Sent as data rather than raised so the message reaches the caller without a worker traceback.
            yield (None, {}, dict(log.counts), list(log.samples), (e.file, e.what, e.column, e.row))

    def _plain(self, units: list[Unit], cut: _Cutter,
               log: ProblemLog) -> Iterator[tuple[list[Columns], dict[str, int]]]:
        """Unit after unit (``window`` 0 or 1), each from its offset on."""
        for u in units:
            start = self.offsets.get(u.key, 0)
            if start < u.num_rows:
                yield from self._in_order(u, start, cut, log)

    def _in_order(self, u: Unit, start: int, cut: _Cutter,
                  log: ProblemLog) -> Iterator[tuple[list[Columns], dict[str, int]]]:
        """One unit's rows from ``start`` on, in file order.

        The plain stream reads every unit so, row mixing a window that cannot resume its interleaving.
        """
        try:
            for table, first in _unit_pieces(u, self.schema, start, self.read_rows):
                last_piece = first + table.num_rows == u.num_rows
                cols = Columns.from_arrow(table, self.schema, u.first_row + first)
                cols = check_columns(cols, self.schema, u.info.path, log, self.on_error)
                if cols.n == 0 and last_piece:
                    cut.updates[u.key] = u.num_rows

                def mark(j: int, cols: Columns = cols, last: bool = last_piece) -> dict[str, int]:
                    done = last and j == cols.n - 1
                    return {u.key: u.num_rows if done else int(cols.rows[j]) - u.first_row + 1}

                yield from cut.feed(cols, mark)
        except DataError as e:
            _skipped(e, self.on_error, log)
            cut.updates[u.key] = u.num_rows

    # ------------------------------------------------------------------ row mixing (window >= 2)
    def _mixed(self, units: list[Unit], cut: _Cutter,
               log: ProblemLog) -> Iterator[tuple[list[Columns], dict[str, int]]]:
        """Window after window of ``window`` units, each interleaved (or, when lenient, unit by unit)."""
        for win in _windows(units, self.window):
            offs = [min(self.offsets.get(u.key, 0), u.num_rows) for u in win]
            if all(o == u.num_rows for o, u in zip(offs, win, strict=True)):
                continue
            labels = _window_labels(win, self.seed, self.epoch)
            start, bad = _window_start(win, offs, labels)
            if bad is None:
                yield from self._interleave(win, offs, labels, start, cut, log)
            elif self.lenient:
                for u, o in zip(win, offs, strict=True):
                    yield from self._in_order(u, o, cut, log)
            else:  # checked by the loader before any worker starts; repeated here as a guard
                raise ValueError(f"loader state does not fit the row mixing at unit {win[bad].key}")

    def _interleave(self, win: list[Unit], offs: list[int], labels: np.ndarray, start: int, cut: _Cutter,
                    log: ProblemLog) -> Iterator[tuple[list[Columns], dict[str, int]]]:
        """The window's rows from position ``start`` on, in the order ``labels`` gives."""
        readers = [_UnitReader(self, u, o, log) for u, o in zip(win, offs, strict=True)]
        counts, done = np.asarray(offs, dtype=np.int64), start  # label counts of labels[:done]

        def at(p: int) -> dict[str, int]:  # offsets once positions < p are delivered (p never decreases)
            nonlocal done
            if p > done:
                counts[:] += np.bincount(labels[done:p], minlength=len(win))
                done = p
            return {u.key: int(c) for u, c in zip(win, counts, strict=True) if c}

        try:
            for a in range(start, len(labels), self.read_rows):
                lab = labels[a:a + self.read_rows]
                order = np.argsort(lab, kind="stable")  # each unit's positions in this chunk, in order
                split = np.cumsum(np.bincount(lab, minlength=len(win)))[:-1]
                parts, where = [], []
                for r, idx in zip(readers, np.split(order, split), strict=True):
                    if not len(idx):
                        continue
                    first = r.cursor
                    for part in r.take(len(idx)):
                        parts.append(part)
                        where.append(a + idx[part.rows - r.unit.first_row - first])
                if not parts:
                    continue
                cols, pos = Columns.concat(parts), np.concatenate(where)
                order = np.argsort(pos, kind="stable")
                cols, pos = cols.gather(order), pos[order]
                yield from cut.feed(cols, lambda j, pos=pos: at(int(pos[j]) + 1))
        finally:
            for r in readers:
                r.close()
        cut.updates.update({u.key: u.num_rows for u in win})  # every row of the window is fed


class ParquetLoader:
    """Iterable of :class:`Batch` over canonical Parquet files; see the module docstring.

    ``files``: Parquet paths, or one dataset folder (all partitions). ``read_rows``: rows decoded at a
    time within a row group (the memory bound). ``on_error``: None follows the schema, ``"skip"``
    turns every ``error`` policy into skip-and-count. ``problems`` accumulates the counts of everything
    skipped or repaired; ``report()`` formats them. Iterating again after a complete pass starts
    the next epoch (with ``shuffle_units`` a new unit order). ``shuffle_window`` >= 2 interleaves the rows
    of consecutive windows of that many units per stream (see the module docstring), ``PARTITION_WINDOW``
    (-1) those of each run of consecutive units from one partition folder; 0 or 1 reads unit after unit.
    ``spread_rows`` > 0 (evaluation on a sample): read only that many rows, whole units spread evenly over
    the files' units (:func:`spread_units`), instead of every row.
    """

    def __init__(self, files: Sequence[str | Path] | str | Path, schema: FeatureSchema, batch_size: int, *,
                 rank: int = 0, world_size: int = 1, num_workers: int = 0, on_error: str | None = None,
                 drop_last: bool = False, shuffle_units: bool = False, seed: int = 0,
                 keep_problems: int = 100, read_rows: int = 8192, shuffle_window: int = 0,
                 spread_rows: int = 0) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        if shuffle_window < PARTITION_WINDOW:
            raise ValueError(f"shuffle_window must be >= 0, or {PARTITION_WINDOW} (a window per partition), "
                             f"got {shuffle_window}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if spread_rows < 0 or (spread_rows and (shuffle_units or mixes(shuffle_window))):
            raise ValueError(f"spread_rows must be >= 0 and reads units in order (no shuffle_units, no "
                             f"shuffle_window), got {spread_rows}")
        if isinstance(files, (str, Path)):
            files = Dataset(files, schema).files() if Path(files).is_dir() else [files]
        self.files = [str(f) for f in files]
        if not self.files:
            raise ValueError("ParquetLoader: no files")
        self.schema = schema
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.num_workers, self.drop_last = num_workers, drop_last
        self.shuffle_units, self.seed = shuffle_units, seed
        self.read_rows, self.shuffle_window = read_rows, shuffle_window
        self.spread_rows = spread_rows
        self.on_error = effective_on_error(schema, on_error)
        self.problems = ProblemLog(raise_errors=True, keep=keep_problems)
        self.epoch = 0
        self._offsets: dict[str, int] = {}
        # Row mixing: the number of streams whose windows this epoch's offsets follow, None when they may
        # follow another one (see load_state_dict); the (window, seed) of the state loaded last.
        self._streams: int | None = self.num_streams
        self._saved_mixing: tuple[int, int | None] = (shuffle_window, seed)
        self._infos: list[FileInfo] = []
        for f in self.files:
            try:
                self._infos.append(inspect_file(f, schema))
            except DataError as e:
                if self.on_error != "skip":
                    raise
                self.problems.add(e.file, e.column, e.what, "skip")
        if shuffle_window == PARTITION_WINDOW:
            largest = collections.Counter(map(_partition, self.all_units())).most_common(1)
            part, n = largest[0] if largest else (None, 0)
            if n > PARTITION_WINDOW_MAX_UNITS:
                raise DatasetError(f"shuffle_window = -1: partition {part} has {n} row groups, more than "
                                   f"{PARTITION_WINDOW_MAX_UNITS} to read at once (a decoded piece of each); "
                                   "use a positive shuffle_window")

    # ------------------------------------------------------------------ units and position
    def all_units(self) -> list[Unit]:
        """Every rank's units in this epoch's order (with ``spread_rows``, only those :func:`spread_units`
        chooses)."""
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
        return spread_units(units, self.spread_rows) if self.spread_rows else units

    def units(self) -> list[Unit]:
        """This rank's units in one whole epoch (its workers' streams one after another)."""
        return [u for stream in self._layout() for u in stream]

    @property
    def num_streams(self) -> int:
        """Streams the units are dealt to (ranks x workers); the deal and the row-mixing windows depend
        on it alone."""
        return self.world_size * max(1, self.num_workers)

    def _layout(self) -> list[list[Unit]]:
        """This rank's units per worker in one whole epoch: streams ``worker * world_size + rank``."""
        streams = deal(self.all_units(), self.num_streams)
        return [streams[w * self.world_size + self.rank] for w in range(max(1, self.num_workers))]

    def _stream_units(self) -> tuple[list[list[Unit]], dict[str, int], bool]:
        """This rank's units per worker from the saved position on, their start offsets, and whether the
        position came from another deal (see :func:`_resume`)."""
        spans = _delivered(self._offsets)
        streams, starts, foreign = [], {}, False
        for stream in self._layout():
            units, st, f = _resume(stream, self._offsets, spans)
            streams.append(units)
            starts.update(st)
            foreign |= f
        return streams, starts, foreign

    @property
    def num_rows(self) -> int:
        """Rows this rank reads in one epoch before any are dropped as bad."""
        return sum(u.num_rows for u in self.units())

    def state_dict(self) -> dict[str, Any]:
        state = {"version": STATE_VERSION, "epoch": self.epoch, "offsets": dict(self._offsets)}
        if mixes(self.shuffle_window):
            state["shuffle"] = {"window": self.shuffle_window, "seed": self.seed, "streams": self._streams}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") not in STATE_VERSIONS:
            raise ValueError(f"loader state version {state.get('version')!r}, expected one of "
                             f"{STATE_VERSIONS}")
        self.epoch = int(state["epoch"])
        self._offsets = {str(k): int(v) for k, v in state["offsets"].items()}
        mixing = state.get("shuffle") or {}
        window = int(mixing.get("window", 0))
        self._saved_mixing = (window if mixes(window) else 0, mixing.get("seed"))
        self._streams = self.num_streams
        same = self._saved_mixing == (self.shuffle_window, self.seed)
        if same and mixing.get("streams") != self.num_streams:
            self._streams = None  # windows of another layout: _check_resume may read some unit by unit

    def _check_resume(self, streams: list[list[Unit]], starts: dict[str, int], foreign: bool) -> bool:
        """Check the offsets against this epoch's row mixing; True when a window must be read unit by unit.

        A window's offsets must be the label counts of a prefix of its interleaving, unless the state
        comes from another number of streams or another deal (then such a window is read unit after unit,
        exactly once).
        """
        if foreign and mixes(self.shuffle_window) and self._saved_mixing == (self.shuffle_window, self.seed):
            self._streams = None  # units cut by another deal: this epoch's windows are not the saved ones
        if not mixes(self.shuffle_window) or not starts:
            return False
        lenient, unfit = self._streams is None, False
        for stream in streams:
            for win in _windows(stream, self.shuffle_window):
                offs = [min(starts.get(u.key, 0), u.num_rows) for u in win]
                if not any(offs) or all(o == u.num_rows for o, u in zip(offs, win, strict=True)):
                    continue
                if not lenient and self._saved_mixing != (self.shuffle_window, self.seed):
                    # A window cut by another mixing: its offsets may fit ours by chance, but refuse always.
                    sw, ss = self._saved_mixing
                    u = next(u for u, o in zip(win, offs, strict=True) if 0 < o < u.num_rows or o == 0)
                    raise ValueError(
                        f"loader state does not fit the row mixing at unit {u.key}: the state was saved "
                        f"mid-window with shuffle_window={sw}, seed={ss}, but this loader mixes with "
                        f"shuffle_window={self.shuffle_window}, seed={self.seed}; resume with the same "
                        f"shuffle_window, seed and shuffle_units (or from an epoch boundary)")
                labels = _window_labels(win, self.seed, self.epoch)
                start, bad = _window_start(win, offs, labels)
                if bad is None:
                    continue
                if not lenient:
                    u = win[bad]
                    held = int(np.count_nonzero(labels[:start] == bad))
                    sw, ss = self._saved_mixing
                    raise ValueError(
                        f"loader state does not fit the row mixing at unit {u.key}: the state has "
                        f"{offs[bad]} of its rows delivered, but with shuffle_window={self.shuffle_window}, "
                        f"seed={self.seed}, epoch {self.epoch} the first {start} rows of its window hold "
                        f"{held} of them (state saved with shuffle_window={sw}, seed={ss}); resume with the "
                        f"same shuffle_window, seed and shuffle_units")
                unfit = True
        if not unfit and not foreign:
            self._streams = self.num_streams  # every window resumes its own interleaving
        return unfit

    def report(self) -> str:
        return self.problems.report()

    def skip(self, batches: int) -> int:
        """Read and drop the next ``batches`` batches of this epoch; returns how many there were (fewer when
        the epoch ends first, and then the next iteration starts the next epoch).

        The position afterwards is the one a checkpoint taken after them would hold, so the next iteration
        resumes there exactly (any mixing window included). A run with a fixed step budget over time-ordered
        data skips its oldest rows this way and ends on the newest ones.
        """
        it = self._batches(tensors=False)  # the same rows, checks and positions, no tensors built
        try:
            for n in range(batches):
                if next(it, None) is None:
                    return n
        finally:
            it.close()
        return batches

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[Batch]:
        return self._batches(tensors=True)

    def _batches(self, tensors: bool) -> Iterator[Any]:
        """The epoch's batches: Batches (``tensors``), or the Columns they would be built from."""
        streams, starts, foreign = self._stream_units()
        lenient = self._check_resume(streams, starts, foreign)
        stream = _Stream(self.schema, streams, starts, self.batch_size, self.drop_last,
                         self.on_error, self.problems.keep, self.read_rows, self.shuffle_window, self.seed,
                         self.epoch, lenient, tensors)
        if self.num_workers == 0:
            items: Any = iter(stream)
        else:
            items = iter(tud.DataLoader(stream, batch_size=None, num_workers=self.num_workers,
                                        collate_fn=_identity, worker_init_fn=_ignore_stop_signals))
        for batch, updates, counts, samples, error in items:
            for k, v in updates.items():
                self._offsets[k] = max(v, self._offsets.get(k, 0))
            self.problems.merge(counts, samples)
            if error is not None:
                file, what, column, row = error
                raise DataError(file, what, column, row)
            if batch is not None:
                yield batch if isinstance(batch, Batch) or not tensors else to_batch(batch, self.schema)
        self.epoch += 1
        self._offsets = {}
        self._streams = self.num_streams
        self._saved_mixing = (self.shuffle_window, self.seed)


def _ignore_stop_signals(worker_id: int) -> None:  # noqa: ARG001
    """A reading worker leaves SIGINT/SIGTERM to the training process, which finishes its step, saves and
    stops: a terminal's Ctrl-C and ``timeout``/systemd send them to the whole process group, and a worker
    that died of SIGTERM took the run down without a checkpoint (one that took SIGINT announced it again)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _identity(x: Any) -> Any:
    return x
