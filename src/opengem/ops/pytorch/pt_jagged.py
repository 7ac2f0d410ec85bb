"""Reference jagged <-> padded ops: FBGEMM's jagged kernels plus plain PyTorch, no in-place writes.

The padded convention everywhere in opengem: rows are right-padded (real events first, oldest first) and
carry a bool mask, True = real. No function here assigns into a tensor in place, because TorchRec's train
pipeline FX-traces the model and torch.compile prefers functional graphs.
"""

from __future__ import annotations

import math

import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm: torchrec imports it too, this keeps ops/ standalone)
import torch
import torch.nn.functional as F


def lengths_to_offsets(lengths: torch.Tensor) -> torch.Tensor:
    """[B] lengths -> [B + 1] offsets starting at 0, same dtype (FBGEMM's complete cumsum)."""
    return torch.ops.fbgemm.asynchronous_complete_cumsum(lengths)


def offsets_to_lengths(offsets: torch.Tensor) -> torch.Tensor:
    return offsets[1:] - offsets[:-1]


def padding_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def jagged_to_padded(
    values: torch.Tensor, offsets: torch.Tensor, max_len: int, padding_value: float
) -> torch.Tensor:
    """[N, *inner] jagged values -> [B, max_len, *inner]; rows longer than max_len are cut at max_len."""
    inner = values.shape[1:]
    flat = values.reshape(values.shape[0], math.prod(inner)) if values.dim() != 2 else values
    padded = torch.ops.fbgemm.jagged_to_padded_dense(flat, [offsets], [max_len], padding_value)
    return padded.reshape(padded.shape[0], max_len, *inner) if values.dim() != 2 else padded


def keep_last_index(lengths: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    kept = lengths.clamp(max=k)
    first = lengths_to_offsets(lengths)[:-1] + (lengths - kept)  # where each row's kept events start
    kept_offsets = lengths_to_offsets(kept)
    total = int(kept_offsets[-1])
    row_first = torch.repeat_interleave(first - kept_offsets[:-1], kept, output_size=total)
    return row_first + torch.arange(total, device=lengths.device, dtype=lengths.dtype), kept


def padded_to_jagged(padded: torch.Tensor, offsets: torch.Tensor, total: int | None) -> torch.Tensor:
    """[B, L, *inner] padded rows -> [N, *inner] jagged values (each row's first ``lengths[b]`` slots)."""
    B, L = padded.shape[:2]
    inner = padded.shape[2:]
    flat = padded.reshape(B, L, math.prod(inner)) if padded.dim() != 3 else padded
    values = torch.ops.fbgemm.dense_to_jagged(flat, [offsets], total)[0]
    return values.reshape(values.shape[0], *inner) if padded.dim() != 3 else values


def zero_padding(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return values * mask.unsqueeze(-1).to(values.dtype)


def ensure_nonempty(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if values.shape[1] > 0:
        return values, mask
    return F.pad(values, (0, 0, 0, 1)), F.pad(mask, (0, 1), value=False)


def gather_last(values: torch.Tensor, lengths: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    B, L, d = values.shape
    ar = torch.arange(k, device=values.device)
    idx = ((lengths - k).clamp(min=0)[:, None] + ar[None, :]).clamp(max=L - 1)
    mask = ar[None, :] < lengths.clamp(max=k)[:, None]
    out = torch.gather(values, 1, idx.unsqueeze(-1).expand(B, k, d))
    return zero_padding(out, mask), mask


def compact(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)
    values = torch.gather(values, 1, order.unsqueeze(-1).expand_as(values))
    mask = torch.gather(mask, 1, order)
    return zero_padding(values, mask), mask
