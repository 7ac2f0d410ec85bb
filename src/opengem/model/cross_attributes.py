"""The cross branch's own, wider embeddings of the small-vocabulary features (OURS: ``cross_width`` of GEM's
cross branch and of DCNv2).

Why: at the budgets of the iso-FLOP study the compute-optimal models have 4-wide tokens, and a cross of two
attributes whose effect has more latent dimensions than the token is wide cannot be represented by any product
of the two tokens. Widening every token multiplies every FLOP of the model; these tables widen only what the
cross layers read, for features whose vocabulary is small (an ad's format, a user's country, the surface), so
they cost width x ids parameters (9,096 at width 8 on the simulator's schema) and the cross FLOPs.
Session 20 found every family missing most of the simulator's attribute crosses
(benchmarks/missed_signals.py); session 32 measured this (benchmarks/results/2026-12-05-s32/cross_width/).

The tables are ordinary dense parameters (``nn.Embedding``, trained by the dense optimizer): small enough that
sharding them would cost more than it saves.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from opengem.data.batch import Batch
from opengem.data.schema import FeatureSchema

SURFACE = "__surface__"


def cross_attribute_fields(schema: FeatureSchema, max_vocab: int) -> list[str]:
    """The single-valued sparse features with at most ``max_vocab`` ids, in schema order."""
    return [f.name for f in schema.sparse if f.vocab <= max_vocab and not f.multi_valued]


class CrossAttributes(nn.Module):
    """[B, (fields + 1) * width]: each chosen feature's own ``width``-wide embedding, then the surface's."""

    def __init__(self, schema: FeatureSchema, width: int, max_vocab: int) -> None:
        super().__init__()
        self.fields = cross_attribute_fields(schema, max_vocab)
        vocab = {f.name: f.vocab for f in schema.sparse}
        self.tables = nn.ModuleDict({name: nn.Embedding(vocab[name], width) for name in self.fields})
        self.tables[SURFACE] = nn.Embedding(len(schema.surfaces), width)
        bound = 1.0 / width**0.5
        for table in self.tables.values():
            nn.init.uniform_(table.weight, -bound, bound)
        self.width = width
        self.out_dim = len(self.tables) * width

    def forward(self, batch: Batch) -> torch.Tensor:
        feats = batch.sparse.to_dict() if self.fields else {}
        out = []
        for name in self.fields:
            jt = feats[name]  # one id per row; a row without one gets zeros (a sum over no ids)
            out.append(F.embedding_bag(jt.values(), self.tables[name].weight, jt.offsets(), mode="sum",
                                       include_last_offset=True))
        out.append(self.tables[SURFACE](batch.surface))
        return torch.cat(out, dim=1)


def with_cross_attributes(x0: torch.Tensor, attributes: CrossAttributes | None, batch: Batch) -> torch.Tensor:
    """The cross layers' input: ``x0`` [B, D], then ``attributes``' embeddings of ``batch`` in x0's dtype
    (x0 itself for a model without them)."""
    if attributes is None:
        return x0
    return torch.cat([x0, attributes(batch).to(x0.dtype)], dim=1)
