"""Baselines trained through GEM's exact path: same FeatureEmbedding, same MultiSurfaceHead, same output.

Equal-FLOPs comparisons are only fair when everything but the interaction differs nowhere, so each
baseline takes ``EmbeddedFeatures`` and replaces only the part between the tokens and the head:

- DLRM (Naumov et al. 2019): bottom MLP on the raw dense features -> one d-vector; pairwise dot products
  (upper triangle, i < j) among [bottom, sparse/surface tokens, mean-pooled sequence tokens]; concat with
  the bottom output; top MLP. The embedding layer is built with ``dense_tokens = 0`` because the bottom
  MLP *is* DLRM's dense path.
- DCNv2 (Wang et al. 2021): x0 = flatten(tokens) ++ mean-pooled sequences; cross layers
  x_{l+1} = x0 ⊙ (W x_l + b) + x_l (W full, or low-rank U Vᵀ); deep MLP in parallel (on x0) or stacked
  (on x_L).
- DIN (Zhou et al. 2018): target attention per sequence group, the ranked ad's token as query; the
  attention unit is an MLP on [q, k, q-k, q*k] (ReLU here; the paper uses PReLU/Dice); weights are used
  unnormalised as in DIN (or masked-softmaxed with ``softmax = true``); the pooled interests are concatenated
  with the flattened tokens and fed to an MLP.

- LR: logistic regression, the floor every model must clear. The same FeatureEmbedding on a copy of the
  schema whose tables are 4 wide (FBGEMM's narrowest; trained by the same fused row-wise Adagrad,
  regularised by the same ``train.embedding_l2``); each sequence group is a bag of its events (per-event
  linear map, masked mean); dense features enter as they are (normalised with ``embedding.dense_norm``).
  The head is the shared MultiSurfaceHead with no trunk and no adapter, so
  logit[s, t] = b[s, t] + sum_k a[s, k, t] x_k over those inputs x_k: linear in the one-hot ids and the
  dense values (an id's effective weight is its row weighed by a; at the start the row's mean, dense
  weights 0), and the bias starts at the base rate like every model's.

Sequence groups are mean-pooled for DLRM and DCNv2 (neither paper models sequences).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import nn

from opengem.config import ConfigError
from opengem.data.batch import Batch
from opengem.data.schema import FeatureSchema
from opengem.model.cross import CrossNetwork
from opengem.model.cross_attributes import CrossAttributes, with_cross_attributes
from opengem.model.embedding import (
    EmbeddedFeatures,
    EmbeddingConfig,
    FeatureEmbedding,
    check_at_least,
    check_choice,
    check_widths,
    masked_mean,
)
from opengem.model.flops import mlp_flops
from opengem.model.heads import HeadConfig, MultiSurfaceHead, context_columns, head_context, mlp
from opengem.model.output import ModelOutput
from opengem.ops.cpu_autocast import to_cpu_autocast_dtype
from opengem.ops.dot_interaction import dot_interaction
from opengem.ops.kernel import inductor_kernel


@dataclass
class DLRMConfig:
    bottom_mlp: list[int] = field(default_factory=lambda: [64])  # hidden widths; the output is always d
    top_mlp: list[int] = field(default_factory=lambda: [128, 64])


@dataclass
class DCNv2Config:
    num_cross_layers: int = 3
    low_rank: int = 0  # 0 = full-rank W; r > 0 = W = U Vᵀ with rank r
    deep_mlp: list[int] = field(default_factory=lambda: [256, 128])
    structure: str = "parallel"  # parallel | stacked
    # OURS: > 0 = the cross layers also read their own embeddings, this wide, of every single-valued sparse
    # feature with at most ``cross_vocab`` ids and of the surface (opengem.model.cross_attributes says why);
    # the deep tower of the parallel form reads the tokens as before
    cross_width: int = 0
    cross_vocab: int = 1000


@dataclass
class DINConfig:
    attention_mlp: list[int] = field(default_factory=lambda: [64, 32])
    softmax: bool = False  # False = DIN's unnormalised weights; True = masked softmax over events
    mlp: list[int] = field(default_factory=lambda: [128, 64])


@dataclass
class LRConfig:
    # each sequence group as a bag of its events' weights (mean over events); False = histories unused
    use_sequences: bool = True


class _Baseline(nn.Module):
    """Embedding -> interaction (subclass) -> head; the shared half of every baseline."""

    def __init__(self, schema: FeatureSchema, emb: EmbeddingConfig, head: HeadConfig) -> None:
        super().__init__()
        self.schema = schema
        self.embedding = FeatureEmbedding(schema, emb)
        self.d = self.embedding.d

    def _make_head(self, in_dim: int, cfg: HeadConfig) -> None:
        # public: the dense columns the head's context term reads (vertical models rebuild its input)
        self.head_context_columns = columns = context_columns(self.schema, cfg.context)
        self.head = MultiSurfaceHead(in_dim, len(self.schema.surfaces), len(self.schema.tasks), cfg,
                                     context_dim=columns.stop - columns.start)

    def interact(self, batch: Batch, emb: EmbeddedFeatures) -> torch.Tensor:
        raise NotImplementedError

    def interact_flops(self, seq_len: int | None) -> int:
        raise NotImplementedError

    def forward(self, batch: Batch) -> ModelOutput:
        emb = self.embedding(batch)
        context = head_context(emb.dense, self.head_context_columns)
        logits, trunk = self.head(self.interact(batch, emb), batch.surface, context)
        return ModelOutput(logits=logits, trunk=trunk, extras={"target": emb.target})

    def flops_per_example(self, seq_len: int | None = None) -> int:
        return (
            self.embedding.flops_per_example(seq_len)
            + self.interact_flops(seq_len)
            + self.head.flops_per_example()
        )


def _seq_means(emb: EmbeddedFeatures) -> list[torch.Tensor]:
    return [masked_mean(s) for s in emb.sequences.values()]


# ----------------------------------------------------------------------------------------------- DLRM
class DLRM(_Baseline):
    def __init__(
        self, schema: FeatureSchema, emb: EmbeddingConfig, head: HeadConfig, cfg: DLRMConfig
    ) -> None:
        check_widths("dlrm.bottom_mlp", cfg.bottom_mlp)
        check_widths("dlrm.top_mlp", cfg.top_mlp)
        super().__init__(schema, dataclasses.replace(emb, dense_tokens=0), head)
        self.cfg = cfg
        d = self.d
        n_dense = schema.num_dense_inputs  # dense features + derived time features
        self._bottom_dims = [n_dense, *cfg.bottom_mlp, d] if n_dense else []
        self.bottom = mlp(self._bottom_dims) if n_dense else None
        self.num_vectors = (1 if n_dense else 0) + self.embedding.num_tokens + len(schema.sequences)
        if self.num_vectors < 2:
            raise ConfigError(
                f"name: DLRM needs at least 2 vectors to interact, schema {schema.name!r} gives "
                f"{self.num_vectors}: choose another model (gem, dcnv2, din)"
            )
        top_in = (d if n_dense else 0) + self.num_vectors * (self.num_vectors - 1) // 2
        self._top_dims = [top_in, *cfg.top_mlp]
        self.top = mlp(self._top_dims)
        self._make_head(self._top_dims[-1], head)

    def interact(self, batch: Batch, emb: EmbeddedFeatures) -> torch.Tensor:
        vecs = list(emb.tokens.unbind(1)) + _seq_means(emb)
        dense_out: list[torch.Tensor] = []
        if self.bottom is not None:
            dense_out = [self.bottom(emb.dense if emb.dense is not None else batch.dense)]
            vecs = dense_out + vecs
        x = torch.stack(vecs, dim=1)  # [B, n, d]
        pairs = dot_interaction(x, kernel=inductor_kernel())  # [B, n(n-1)/2]
        return self.top(torch.cat([*dense_out, pairs], dim=1))

    def interact_flops(self, seq_len: int | None) -> int:
        n = self.num_vectors
        bottom = mlp_flops(self._bottom_dims) if self._bottom_dims else 0
        return bottom + 2 * n * n * self.d + mlp_flops(self._top_dims)


# ---------------------------------------------------------------------------------------------- DCNv2
class DCNv2(_Baseline):
    def __init__(
        self, schema: FeatureSchema, emb: EmbeddingConfig, head: HeadConfig, cfg: DCNv2Config
    ) -> None:
        check_choice("dcnv2.structure", cfg.structure, ("parallel", "stacked"))
        check_at_least("dcnv2.num_cross_layers", cfg.num_cross_layers, 0)
        check_at_least("dcnv2.low_rank", cfg.low_rank, 0)
        check_widths("dcnv2.deep_mlp", cfg.deep_mlp)
        check_at_least("dcnv2.cross_width", cfg.cross_width, 0)
        check_at_least("dcnv2.cross_vocab", cfg.cross_vocab, 1)
        super().__init__(schema, emb, head)
        self.cfg = cfg
        D = self.in_dim = (self.embedding.num_tokens + len(schema.sequences)) * self.d
        self.cross_attributes = (CrossAttributes(schema, cfg.cross_width, cfg.cross_vocab)
                                 if cfg.cross_width else None)
        Dc = D + (self.cross_attributes.out_dim if self.cross_attributes is not None else 0)
        self.cross = CrossNetwork(Dc, cfg.num_cross_layers, cfg.low_rank)
        parallel = cfg.structure == "parallel"
        self._deep_dims = [D if parallel else Dc, *cfg.deep_mlp]
        self.deep = mlp(self._deep_dims) if cfg.deep_mlp else None
        if parallel:
            out = Dc + (cfg.deep_mlp[-1] if cfg.deep_mlp else 0)
        else:
            out = self._deep_dims[-1]
        self._make_head(out, head)

    def interact(self, batch: Batch, emb: EmbeddedFeatures) -> torch.Tensor:
        # under CPU autocast: cast x0 once, so the cross layers and the final cat stay in bf16
        x0 = to_cpu_autocast_dtype(torch.cat([emb.tokens.flatten(1), *_seq_means(emb)], dim=1))
        x = self.cross(with_cross_attributes(x0, self.cross_attributes, batch))
        if self.deep is None:
            return x
        if self.cfg.structure == "stacked":
            return self.deep(x)
        return torch.cat([x, to_cpu_autocast_dtype(self.deep(x0))], dim=1)

    def interact_flops(self, seq_len: int | None) -> int:
        deep = mlp_flops(self._deep_dims) if self.deep is not None else 0
        return self.cross.flops_per_example() + deep


# ------------------------------------------------------------------------------------------------ DIN
class TargetAttention(nn.Module):
    """DIN's activation unit: weight_l = MLP([q, k_l, q-k_l, q*k_l]); interest = Σ_l weight_l k_l."""

    def __init__(self, d: int, hidden: list[int], softmax: bool = False) -> None:
        super().__init__()
        self._dims = [4 * d, *hidden, 1]
        self.mlp = mlp(self._dims, final_activation=False)
        self.softmax = softmax

    def forward(self, query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """query [B, d], keys [B, L, d], mask [B, L] -> interest [B, d]; masked events never contribute."""
        q = query[:, None, :].expand_as(keys)
        score = self.mlp(torch.cat([q, keys, q - keys, q * keys], dim=-1)).squeeze(-1)  # [B, L]
        if self.softmax:
            score = torch.softmax(score.masked_fill(~mask, -1e30), dim=1)
        w = torch.where(mask, score, torch.zeros_like(score))
        keys = torch.where(mask[..., None], keys, torch.zeros_like(keys))
        return (w[..., None] * keys).sum(dim=1)

    def flops_per_example(self, seq_len: int) -> int:
        return mlp_flops(self._dims, rows=seq_len)


class DIN(_Baseline):
    def __init__(self, schema: FeatureSchema, emb: EmbeddingConfig, head: HeadConfig, cfg: DINConfig) -> None:
        check_widths("din.attention_mlp", cfg.attention_mlp)
        check_widths("din.mlp", cfg.mlp)
        super().__init__(schema, emb, head)
        self.cfg = cfg
        self.attention = nn.ModuleDict(
            {g.name: TargetAttention(self.d, cfg.attention_mlp, cfg.softmax) for g in schema.sequences}
        )
        self._mlp_dims = [(self.embedding.num_tokens + len(schema.sequences)) * self.d, *cfg.mlp]
        self.mlp = mlp(self._mlp_dims)
        self._make_head(self._mlp_dims[-1], head)

    def interact(self, batch: Batch, emb: EmbeddedFeatures) -> torch.Tensor:
        interests = [self.attention[g](emb.target, s.values, s.mask) for g, s in emb.sequences.items()]
        return self.mlp(torch.cat([emb.tokens.flatten(1), *interests], dim=1))

    def interact_flops(self, seq_len: int | None) -> int:
        att = sum(
            self.attention[g.name].flops_per_example(self.embedding.seq_len(g.name, seq_len))
            for g in self.schema.sequences
        )
        return att + mlp_flops(self._mlp_dims)


# ------------------------------------------------------------------------------------------------- LR
# TorchRec's fused (FBGEMM) kernels need table widths divisible by 4, so an id holds 4 numbers; the head
# weighs them into the id's one effective weight (their mean at the start).
LR_DIM = 4


def weight_schema(schema: FeatureSchema, use_sequences: bool = True) -> FeatureSchema:
    """``schema`` with every embedding table LR_DIM wide; sequence groups dropped unless
    ``use_sequences``. Vocabularies and table sharing are kept, so ids mean the same rows."""
    thin = [dataclasses.replace(f, dim=LR_DIM) for f in schema.sparse]
    groups = [
        dataclasses.replace(g, fields=tuple(dataclasses.replace(f, dim=LR_DIM) if f.kind == "id" else f
                                            for f in g.fields))
        for g in schema.sequences
    ] if use_sequences else []
    return dataclasses.replace(schema, sparse=tuple(thin), sequences=tuple(groups))


class LR(_Baseline):
    """Logistic regression through the shared embedding and head (see the module docstring)."""

    def __init__(self, schema: FeatureSchema, emb: EmbeddingConfig, head: HeadConfig, cfg: LRConfig) -> None:
        lr_schema = weight_schema(schema, cfg.use_sequences)
        # d = LR_DIM without grouping: each sparse feature's pooled row is its own token, unprojected; no
        # dense MLP (dense features go straight to the head); the surface token only when nothing else
        # would be a token (a dense-only schema), where it is one more per-surface constant
        lr_emb = dataclasses.replace(emb, d=LR_DIM, dense_tokens=0, group_small=False,
                                     surface_token=not schema.sparse)
        linear_head = dataclasses.replace(head, hidden=[], adapter_dim=0)  # keeps head.dropout
        super().__init__(lr_schema, lr_emb, linear_head)
        self.schema = schema
        self.cfg = cfg
        # inputs derived from ids: one LR_DIM block per token and per sequence group, then the dense values
        self.num_id_inputs = (self.embedding.num_tokens + len(lr_schema.sequences)) * LR_DIM
        self.num_dense = schema.num_dense_inputs  # dense features + derived time features
        self._make_head(self.num_id_inputs + self.num_dense, linear_head)
        with torch.no_grad():  # start as plain LR: an id's weight is the mean of its row; dense weights 0
            self.head.out_weight[:, : self.num_id_inputs].fill_(1.0 / LR_DIM)
            self.head.out_weight[:, self.num_id_inputs :].zero_()

    def interact(self, batch: Batch, emb: EmbeddedFeatures) -> torch.Tensor:
        parts = [emb.tokens.flatten(1), *_seq_means(emb)]
        if self.num_dense:
            parts.append((emb.dense if emb.dense is not None else batch.dense).to(emb.tokens.dtype))
        return torch.cat(parts, dim=1)

    def interact_flops(self, seq_len: int | None) -> int:
        return 0
