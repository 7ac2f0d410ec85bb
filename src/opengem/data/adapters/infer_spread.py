"""Finding the histories a log spreads over numbered columns, one event a cell (``hist_0`` .. ``hist_49``;
DMR's Taobao layout: ``cate0`` .. ``cate49``, 0 where the history is shorter), for ``--infer-schema``.

Numbered columns are not always a history (``price_1`` .. ``price_7`` may be a week of spend; ``mask0``
.. ``mask49`` marks which slots are real), so a group is proposed only where a history is the likely
reading: at least MIN_SPREAD_COLUMNS columns whose numbers run without a gap from 0 or 1, all of an id type
(integers or text, never floats), and, where a sample is read, more than two distinct values (two are flags).
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
        name = stem.rstrip("_-. ") or stem
        if name in names or name in {g[0] for g in found}:
            name = f"{name}_history"
        if name in names:
            continue
        found.append((name, columns, pad))
    return found
