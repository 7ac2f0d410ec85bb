"""Plain-PyTorch embedding lookups over a trained model's TorchRec tables, for export.

TorchRec's ``EmbeddingBagCollection``/``EmbeddingCollection`` take a ``KeyedJaggedTensor`` whose
``to_dict()``/``permute()`` split values with Python lists computed from tensor data; ``torch.export``
cannot trace that for a dynamic batch. The serving copy of a model therefore swaps each TorchRec module
for a twin built on ``F.embedding_bag``/``F.embedding`` over the *same* weight tensors, fed by
:class:`FlatFeatures`, a duck-typed stand-in for the KJT that keeps one (values, lengths) pair per feature
and never splits anything. ``FeatureEmbedding.forward`` itself is untouched, so pooling, mean division,
projections and sequence padding are the training code, not a copy of it; tests pin the twins equal to
the TorchRec path.
"""

from __future__ import annotations

import copy
import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from opengem.data.batch import Batch
from opengem.data.schema import SEQ_SEP
from opengem.model.embedding import FeatureEmbedding
from opengem.ops.kernel import Kernel


class FlatJagged:
    """One feature's jagged rows: flat ``values`` and per-row ``lengths`` (the JaggedTensor surface the
    model reads)."""

    def __init__(self, values: torch.Tensor, lengths: torch.Tensor) -> None:
        self._values, self._lengths = values, lengths

    def values(self) -> torch.Tensor:
        return self._values

    def lengths(self) -> torch.Tensor:
        return self._lengths

    def offsets(self) -> torch.Tensor:
        return torch.cat([self._lengths.new_zeros(1), torch.cumsum(self._lengths, 0)])


class FlatFeatures:
    """A KeyedJaggedTensor stand-in holding each key's (values, lengths) apart: ``to_dict`` and
    ``permute`` are dictionary operations, so nothing depends on tensor data when traced."""

    def __init__(self, features: dict[str, FlatJagged]) -> None:
        self._features = features

    def keys(self) -> list[str]:
        return list(self._features)

    def to_dict(self) -> dict[str, FlatJagged]:
        return dict(self._features)

    def permute(self, order: list[int]) -> FlatFeatures:
        keys = self.keys()
        return FlatFeatures({keys[i]: self._features[keys[i]] for i in order})

    def __getitem__(self, key: str) -> FlatJagged:
        return self._features[key]


class _PooledFeatures:
    """What ``ebc(...)`` returns as far as FeatureEmbedding reads it: ``to_dict()`` of pooled tensors."""

    def __init__(self, pooled: dict[str, torch.Tensor]) -> None:
        self._pooled = pooled

    def to_dict(self) -> dict[str, torch.Tensor]:
        return self._pooled


class PlainEmbeddingBags(nn.Module):
    """SUM-pooled lookups of an ``EmbeddingBagCollection``'s tables with ``F.embedding_bag``."""

    def __init__(self, ebc: EmbeddingBagCollection) -> None:
        super().__init__()
        self.weights = nn.ParameterDict()
        self.feature_table: dict[str, str] = {}
        for cfg, bag in zip(ebc.embedding_bag_configs(), ebc.embedding_bags.values()):
            self.weights[cfg.name] = nn.Parameter(bag.weight.detach(), requires_grad=False)
            for f in cfg.feature_names:
                self.feature_table[f] = cfg.name

    def forward(self, features: FlatFeatures) -> _PooledFeatures:
        out = {}
        for name in features.keys():
            jt = features[name]
            out[name] = F.embedding_bag(jt.values(), self.weights[self.feature_table[name]], jt.offsets(),
                                        mode="sum", include_last_offset=True)
        return _PooledFeatures(out)


class PlainEmbeddings(nn.Module):
    """Unpooled lookups of an ``EmbeddingCollection``'s tables with ``F.embedding``."""

    def __init__(self, ec: EmbeddingCollection) -> None:
        super().__init__()
        self.weights = nn.ParameterDict()
        self.feature_table: dict[str, str] = {}
        for cfg, emb in zip(ec.embedding_configs(), ec.embeddings.values()):
            self.weights[cfg.name] = nn.Parameter(emb.weight.detach(), requires_grad=False)
            for f in cfg.feature_names:
                self.feature_table[f] = cfg.name

    def forward(self, features: FlatFeatures) -> dict[str, FlatJagged]:
        return {name: FlatJagged(F.embedding(features[name].values(), self.weights[self.feature_table[name]]),
                                 features[name].lengths())
                for name in features.keys()}


def with_plain_lookups(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` in eval mode whose FeatureEmbedding modules look up through the plain twins
    (same weights, copied) and pad sequences to the schema's ``max_len`` (a static shape for export; padded
    slots are masked, so scores do not change), with every block on the reference (``pytorch``) ops."""
    model = copy.deepcopy(model).eval()
    for module in model.modules():
        if isinstance(getattr(module, "kernel", None), Kernel):
            # the reference ops: hand-fused twins (same parameters, tested equal) may use data-dependent
            # shapes that torch.export cannot trace for a dynamic batch
            module.kernel = Kernel.PYTORCH
        if isinstance(module, FeatureEmbedding):
            if module.ebc is not None:
                module.ebc = PlainEmbeddingBags(module.ebc)  # type: ignore[assignment]
            for key in list(module.ecs):
                module.ecs[key] = PlainEmbeddings(module.ecs[key])  # type: ignore[assignment]
            module._ec_input = types.MethodType(_flat_ec_input, module)  # type: ignore[method-assign]
            module.cfg = copy.copy(module.cfg)
            module.cfg.pad_to_max_len = True
    return model


def _flat_ec_input(self: FeatureEmbedding, batch: Batch, sparse: dict[str, Any], names: list[str]
                   ) -> FlatFeatures:
    """``FeatureEmbedding._ec_input`` without the concatenation into one KJT (same features, same order)."""
    out = {}
    for name in names:
        if SEQ_SEP in name:
            g, f = name.split(SEQ_SEP, 1)
            sb = batch.sequences[g]
            out[name] = FlatJagged(sb.ids[f], sb.lengths)
        else:
            out[name] = FlatJagged(sparse[name].values(), sparse[name].lengths())
    return FlatFeatures(out)
