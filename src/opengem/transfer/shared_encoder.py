"""Sharing the FM's sequence encoder inside a VM: the FM's history path, run on the VM's short history.

The VM has no slot for an extra token and a smaller width, so the FM path (its sequence tables, per-group
event projection, group type embeddings and long-sequence encoder, all at the FM width) is copied whole,
its output masked-mean pooled to one FM-width vector, and a small trainable Linear maps that vector to the
width of the VM's interaction output, where it is added before the head. Copies (not references) keep
the FM untouched and work when the FM is DMP-sharded. The pyramid encoder's target query is zero: the VM
does not rebuild the FM's ranked-ad token (that would need the FM's whole sparse front end). Event
fields the VM schema dropped enter the FM's event projection as zeros.

Every copied component is extra serving compute except lookups: per-event projection, encoder and the
Linear are counted by :meth:`SharedHistoryEncoder.flops`.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from opengem.data.batch import Batch
from opengem.data.schema import FeatureSchema
from opengem.model.flops import linear_flops
from opengem.model.gem import GEM, merge_sequences
from opengem.ops.jagged import jagged_to_padded
from opengem.transfer.sharing import _plain_state


def find_gem(fm: nn.Module) -> GEM:
    """The GEM inside a (possibly DMP-wrapped) FM."""
    for m in fm.modules():
        if isinstance(m, GEM):
            return m
    raise ValueError(f"share_sequence_encoder: the FM is a {type(fm).__name__}, not a GEM")


class SharedHistoryEncoder(nn.Module):
    """FM history path on a VM batch -> [B, out_dim]; the FM-copied parameters are ``shared_names()``."""

    def __init__(self, fm: nn.Module, vm_schema: FeatureSchema, out_dim: int) -> None:
        super().__init__()
        gem = find_gem(fm)
        if not gem.groups:
            raise ValueError("share_sequence_encoder: the FM has no sequence encoder (no sequence groups)")
        self.groups = list(gem.groups)
        vm_groups = {g.name: g for g in vm_schema.sequences}
        self.fm_schema, self.vm_schema = gem.schema, vm_schema
        for name in self.groups:
            fg = gem.schema.sequence(name)
            if name not in vm_groups:
                raise ValueError(
                    f"share_sequence_encoder: the VM schema has no sequence group {name!r} "
                    f"(vm.schema.max_len must be > 0; VM groups: {list(vm_groups)})"
                )
            kept = {v.name for v in vm_groups[name].fields}
            if not any(f.name in kept for f in fg.fields):
                raise ValueError(f"share_sequence_encoder: the VM keeps no field of FM group {name!r}")
        state = _plain_state(fm)
        tables = {k.split(".")[-2]: v for k, v in state.items() if ".embeddings." in k}
        self.tables = nn.ModuleDict()
        for name in self.groups:
            for f in gem.schema.sequence(name).id_fields:
                if f.table_name not in self.tables:
                    if f.table_name not in tables:
                        raise KeyError(f"share_sequence_encoder: FM table {f.table_name!r} not found")
                    w = tables[f.table_name].detach().clone().float()
                    self.tables[f.table_name] = nn.Embedding.from_pretrained(w, freeze=False)
        self.seq_proj = nn.ModuleDict({g: copy.deepcopy(gem.embedding.seq_proj[g]) for g in self.groups})
        self.seq_dense_bn = nn.ModuleDict(
            {g: copy.deepcopy(m) for g, m in gem.embedding.seq_dense_bn.items() if g in self.groups}
        )
        self.group_type = nn.Parameter(gem.group_type.detach().clone())
        self.encoder = copy.deepcopy(gem.encoder)
        self.d = gem.embedding.d
        self.proj = nn.Linear(self.d, out_dim)
        self._seq_in = {g: self.seq_proj[g].in_features for g in self.groups}

    def shared_names(self) -> list[str]:
        """Parameter names copied from the FM (everything but the projection)."""
        return [n for n, _ in self.named_parameters() if not n.startswith("proj.")]

    def _group(self, batch: Batch, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        g = self.fm_schema.sequence(name)
        if name not in batch.sequences:
            raise KeyError(f"SharedHistoryEncoder: batch has no sequence group {name!r}")
        sb = batch.sequences[name]
        # fields the VM schema dropped enter the FM's event projection as zeros (= those inputs removed)
        n = int(sb.lengths.sum())
        dtype = self.group_type.dtype
        parts = [
            self.tables[f.table_name](sb.ids[f.name])
            if f.name in sb.ids
            else torch.zeros(n, f.dim, dtype=dtype, device=sb.lengths.device)
            for f in g.id_fields
        ]
        for f in g.dense_fields:
            parts.append(
                sb.dense[f.name].to(dtype)[:, None]
                if f.name in sb.dense
                else torch.zeros(n, 1, dtype=dtype, device=sb.lengths.device)
            )
        if name in self.seq_dense_bn:
            k = len(g.dense_fields)
            parts = parts[:-k] + [self.seq_dense_bn[name](torch.cat(parts[-k:], dim=1))]
        flat = self.seq_proj[name](torch.cat(parts, dim=1))
        L = self.vm_schema.sequence(name).max_len
        return jagged_to_padded(flat, sb.lengths, L)

    def forward(self, batch: Batch) -> torch.Tensor:
        seq, mask = merge_sequences([self._group(batch, g) for g in self.groups], self.group_type)
        out, m = self.encoder(seq, mask, None)
        w = m.to(out.dtype)[..., None]
        pooled = (out * w).sum(1) / w.sum(1).clamp(min=1.0)
        return self.proj(pooled)

    def history_len(self, seq_len: int | None = None) -> int:
        return sum(self._len(g, seq_len) for g in self.groups)

    def _len(self, g: str, seq_len: int | None) -> int:
        L = self.vm_schema.sequence(g).max_len
        return L if seq_len is None else min(L, seq_len)

    def flops(self, seq_len: int | None = None) -> int:
        """Serving FLOPs/example at the VM's history length: event projections + encoder + projection."""
        total = sum(linear_flops(self._seq_in[g], self.d, rows=self._len(g, seq_len)) for g in self.groups)
        total += self.encoder.flops(self.history_len(seq_len))
        return total + linear_flops(self.d, self.proj.out_features)
