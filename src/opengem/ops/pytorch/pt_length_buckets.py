"""Reference length-bucket ops: plain PyTorch, no in-place writes (see :mod:`opengem.ops.length_buckets`)."""

from __future__ import annotations

import torch


def length_buckets(lengths: torch.Tensor, k: int) -> list[tuple[torch.Tensor, int]]:
    """Stable sort by length, ``k`` near-equal row counts, neighbours of the same longest length merged."""
    n = lengths.shape[0]
    if n == 0:
        return []
    order = torch.argsort(lengths, stable=True)
    k = min(k, n)
    ends = [n * (i + 1) // k for i in range(k)]
    # one host sync for every bucket's longest row (the sorted length at its last position)
    longest = lengths.index_select(0, order[torch.tensor(ends, device=lengths.device) - 1]).tolist()
    spans: list[list[int]] = []  # [start, end, longest]
    start = 0
    for end, top in zip(ends, longest):
        if spans and spans[-1][2] == top:
            spans[-1][1] = end
        else:
            spans.append([start, end, int(top)])
        start = end
    return [(order[s:e], top) for s, e, top in spans]


def take_rows(
    values: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Slice the padded axis first, so only the kept ``width`` columns are copied."""
    return values[:, :width].index_select(0, rows), mask[:, :width].index_select(0, rows)


def restore_rows(parts: list[torch.Tensor], rows: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate, then copy every part's rows to their batch positions (backward: a gather, exact)."""
    stacked = torch.cat(parts, dim=0)
    where = torch.cat(rows, dim=0)
    return stacked.new_zeros(stacked.shape).index_copy(0, where, stacked)
