"""Finding the histories that are attributes of the same events, for ``--infer-schema``: a DIN log's
``hist_item_id`` and ``hist_cate_id`` (the items a user clicked and their categories, cell for cell), DMR's
category, brand and behaviour-type columns. Such histories become one sequence group (the spec's ``group``),
so a model reads each event whole instead of two unrelated histories.

The sample decides: histories whose event counts are equal in every sampled row, and not the same in all of
them (two always-full windows of 10 would match by construction, not by alignment), are proposed as one
group. Its first field is the first of them that shares a feature's vocabulary (an item id), else the first
in column order.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from opengem.data.adapters.vocab import gather_columns, split_cells


class SequenceSpec(Protocol):
    """What grouping reads of an import spec's [[sequence]] (``infer.SequenceSpec``; a protocol, so that
    this module does not import the one that calls it)."""

    name: str
    columns: list[str]
    pad: str
    separator: str
    share: str
    group: str


def sample_lengths(sample: pa.RecordBatch, q: SequenceSpec) -> np.ndarray | None:
    """Each sampled row's event count of history ``q`` as the importer will read it (its gathering of spread
    cells, its splitting of joined ones, over the sample's text; None when the sample lacks one of its
    columns)."""
    names = sample.schema.names
    if q.columns:
        if not all(c in names for c in q.columns):
            return None
        lists = gather_columns([pc.cast(sample.column(c), pa.string()) for c in q.columns], q.pad)
    elif q.name not in names:
        return None
    else:
        col = sample.column(q.name)
        lists = split_cells(col, q.separator) if q.separator else col
    if not (pa.types.is_list(lists.type) or pa.types.is_large_list(lists.type)):
        return None
    return pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False).astype(np.int64)


def infer_groups(sample: pa.RecordBatch | None, sequences: list[SequenceSpec]) -> None:
    """Set ``group`` on every history that is another attribute of an earlier one's events (see the module
    docstring); histories the sample cannot tell stay apart."""
    if sample is None or sample.num_rows < 2:
        return
    lengths = {q.name: sample_lengths(sample, q) for q in sequences}
    taken: set[str] = set()
    for q in sequences:
        n = lengths[q.name]
        if q.name in taken or n is None or len(np.unique(n)) < 2:
            continue
        same = [r for r in sequences if r.name not in taken and (m := lengths[r.name]) is not None
                and np.array_equal(m, n)]
        if len(same) < 2:
            continue
        head = next((r for r in same if r.share), same[0])
        for r in same:
            if r is not head:
                r.group = head.name
        taken |= {r.name for r in same}
