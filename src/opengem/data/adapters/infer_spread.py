"""Finding the histories a log spreads over numbered columns, one event a cell (``hist_0`` .. ``hist_49``;
DMR's Taobao layout: ``cate0`` .. ``cate49``, 0 where the history is shorter), for ``--infer-schema``.

Numbered columns are not always a history (``price_1`` .. ``price_7`` may be a week of spend; ``mask0``
.. ``mask49`` marks which slots are real), so a group is proposed only where a history is the likely
reading: at least MIN_SPREAD_COLUMNS columns whose numbers run without a gap from 0 or 1, all of an id type
(integers or text, never floats), and, where a sample is read, more than two distinct values (two are flags),
the events of each row one run of neighbouring columns and values shared between columns (separate numbered
fields, Criteo's I1..I13 and C1..C26, are not one history).
The filler is proposed as ``pad = "0"`` only where the sample shows 0 the way a filler is laid out: in some
row, and in no row between two of its events (a real id 0 inside a history keeps ``pad`` empty, and the user
decides). The columns are listed in their numbers' order, which the spec reads as oldest first; a log that
writes the newest first needs the list reversed by hand.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MIN_SPREAD_COLUMNS = 4  # fewer numbered columns (x1, x2, x3) are more often separate features
NUMBERED = re.compile(r"^(.*\D)(\d+)$")  # a name, then the column's number: hist_12, cate12
FILLER = "0"
MAX_GAP_SHARE = 0.01  # rows whose events are not one run: more, and the columns are separate fields
MIN_VALUES_TO_COMPARE = 200  # distinct sampled values below which the sharing test is not made
MIN_SHARED_SHARE = 0.02  # values seen in two or more columns: fewer, and they are separate vocabularies


def _id_type(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)


def _cells(sample: pa.RecordBatch, columns: list[str]) -> np.ndarray:
    """The sample's cells of ``columns`` as trimmed text, rows x columns ("" where empty)."""
    out = []
    for c in columns:
        col = pc.cast(sample.column(c), pa.string())
        out.append(pc.fill_null(pc.utf8_trim_whitespace(col), "").to_numpy(zero_copy_only=False))
    return np.stack(out, axis=1).astype(str)


def _filler(cells: np.ndarray) -> str:
    """FILLER when some row has it and no row has it between two of its real events, else ""."""
    any_filler = False
    for row in cells:
        zero = row == FILLER
        if not zero.any():
            continue
        any_filler = True
        real = np.flatnonzero(~zero & (row != ""))
        if len(real) and zero[real[0]:real[-1] + 1].any():
            return ""
    return FILLER if any_filler else ""


def _history_shaped(cells: np.ndarray, pad: str) -> bool:
    """Whether the sampled cells are laid out as one history: in (almost) every row the events (cells
    neither empty nor ``pad``) are one run of neighbouring columns, a shorter history leaving the cells at
    one end empty, and the columns share values (events of one kind of id: an item seen at several
    positions). Numbered separate fields fail one or the other: Criteo's counts I1..I13 and categorical
    fields C1..C26 are empty here and there inside a row (in 95 % of the rows of its head), and the
    C fields' values are of 26 vocabularies (no value in two columns); DMR's 50 category columns, 0-padded,
    have no gap in any row and 72 % of their values in more than one column."""
    real = cells != ""
    if pad:
        real &= cells != pad
    rows = real[real.any(axis=1)]
    if not len(rows):
        return False
    first = rows.argmax(axis=1)
    last = rows.shape[1] - 1 - rows[:, ::-1].argmax(axis=1)
    gaps = int((last - first + 1 != rows.sum(axis=1)).sum())
    if gaps > max(1, MAX_GAP_SHARE * len(rows)):
        return False
    seen = [set(cells[real[:, k], k].tolist()) for k in range(cells.shape[1])]
    values = set().union(*seen)
    if len(values) < MIN_VALUES_TO_COMPARE:
        return True  # too few to tell separate vocabularies from a short sample of one
    in_two = sum(1 for v in values if sum(v in s for s in seen) >= 2)
    return in_two >= MIN_SHARED_SHARE * len(values)


def find_spread(source: pa.Schema, sample: pa.RecordBatch | None,
                skip: set[str]) -> list[tuple[str, list[str], str]]:
    """(history name, its columns in their numbers' order, pad) for every group of ``source``'s columns
    (outside ``skip``: the label, time and surface roles) that reads as one history. The name is the
    columns' shared stem (``hist_`` -> ``hist``), or ``<stem>_history`` where a column already has it."""
    groups: dict[str, dict[int, str]] = {}
    for f in source:
        m = NUMBERED.match(f.name)
        if f.name in skip or not m or not _id_type(f.type):
            continue
        groups.setdefault(m.group(1), {})[int(m.group(2))] = f.name
    found = []
    names = set(source.names)
    for stem, numbered in groups.items():
        nums = sorted(numbered)
        if len(nums) < MIN_SPREAD_COLUMNS or nums[0] not in (0, 1) or nums[-1] - nums[0] + 1 != len(nums):
            continue
        columns = [numbered[n] for n in nums]
        pad = ""
        if sample is not None and all(c in sample.schema.names for c in columns):
            cells = _cells(sample, columns)
            if len(np.setdiff1d(np.unique(cells), [""])) <= 2:
                continue  # flags (mask0..mask49), not a history of ids
            pad = _filler(cells)
            if not _history_shaped(cells, pad):
                continue  # separate fields that happen to be numbered (Criteo's I1..I13, C1..C26)
        name = stem.rstrip("_-. ") or stem
        if name in names or name in {g[0] for g in found}:
            name = f"{name}_history"
        if name in names:
            continue
        found.append((name, columns, pad))
    return found
