"""GEM: embeddings -> long-sequence encoder -> InterFormer layers (Wukong interaction) -> multi-surface head.

With sequence groups (and ``use_sequences``): the groups are merged into ONE sequence (OUR choice, since
GEM does not publish how it mixes histories): each row's events of group 1, then of group 2, ..., kept
oldest-first within a group and compacted so real events are contiguous; every event gets its group's
learned type embedding. The merged sequence goes through the long-sequence encoder (keyed by the ranked
ad's token), then ``interformer.num_layers`` InterFormer layers, each with one Wukong layer as its
Interaction Arch. Without sequence groups (or with ``use_sequences = false``, the registry's "wukong"),
GEM is a ``wukong.num_layers`` Wukong stack on the feature tokens, and the head reads the flattened
output tokens.

extras: "ad" = the ranked ad's token, "user" = the mean of the sequence summary S_sum (or of the final
interaction tokens when there is no sequence), "trunk" = the head's shared trunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from opengem.config import ConfigError
from opengem.data.batch import Batch
from opengem.data.schema import FeatureSchema
from opengem.model.embedding import (
    EmbeddedFeatures,
    EmbeddingConfig,
    FeatureEmbedding,
    check_at_least,
    check_choice,
    check_heads,
    check_widths,
)
from opengem.model.heads import HeadConfig, MultiSurfaceHead
from opengem.model.interformer import InterFormer, InterFormerConfig
from opengem.model.output import ModelOutput
from opengem.model.sequence import SequenceEncoder, SequenceEncoderConfig, _pyramid_plan, use_kernel
from opengem.model.wukong import WukongConfig, WukongStack
from opengem.ops.jagged import compact, zero_padding
from opengem.ops.kernel import WITH_FUSED


@dataclass
class GEMConfig:
    """GEM trunk: every size knob lives in the three block configs."""

    wukong: WukongConfig = field(default_factory=WukongConfig)
    interformer: InterFormerConfig = field(default_factory=InterFormerConfig)
    sequence: SequenceEncoderConfig = field(default_factory=SequenceEncoderConfig)
    use_sequences: bool = True  # false = ignore sequence groups: a plain Wukong stack + head
    # ops kernel of every block (opengem.ops.kernel): "fused" = the hand-fused twins (same parameters, same
    # numbers within fp32 rounding, faster), "pytorch" = the reference ops
    kernel: str = "fused"


def check_sizes(cfg: GEMConfig, d: int, seq_max_len: int | None) -> None:
    """Every size knob GEM will use, checked before any block is built; a bad one is a ConfigError naming
    its key (``gem.wukong.k``), where the block itself would fail on a shape or divide by zero.

    ``d``: the token width (embedding.d); ``seq_max_len``: the merged sequence's length, None when GEM
    reads no sequence (then the [gem.interformer] and [gem.sequence] sizes are not used, and not checked).
    """
    w, f, s = cfg.wukong, cfg.interformer, cfg.sequence
    check_choice("gem.kernel", cfg.kernel, tuple(k.value for k in WITH_FUSED))
    if seq_max_len is None:
        layers_key, layers = "gem.wukong.num_layers", w.num_layers
    else:
        layers_key, layers = "gem.interformer.num_layers", f.num_layers
    check_at_least(layers_key, layers, 1)
    check_at_least("gem.wukong.n_fm", w.n_fm, 1)
    check_at_least("gem.wukong.n_lin", w.n_lin, 0)
    check_at_least("gem.wukong.k", w.k, 1)
    check_widths("gem.wukong.mlp_dims", w.mlp_dims)
    if not 0 <= w.dropout <= 1:
        raise ConfigError(f"gem.wukong.dropout: must be in [0, 1] (got {w.dropout!r})")
    if w.input_attentive_y:
        check_at_least("gem.wukong.y_hidden", w.y_hidden, 1)
    if w.cross_layer_attention:
        check_heads("gem.wukong.cla_heads", w.cla_heads, d)
    if w.pyramid:
        if len(w.pyramid) != layers:
            raise ConfigError(f"gem.wukong.pyramid: needs one token count per layer, {layers} "
                              f"({layers_key}), got {len(w.pyramid)} ({w.pyramid!r})")
        if any(n < 2 for n in w.pyramid):
            raise ConfigError(f"gem.wukong.pyramid: every layer needs >= 2 tokens (one FM, one linear), "
                              f"got {w.pyramid!r}")
    if seq_max_len is None:
        return
    check_at_least("gem.interformer.n_cls", f.n_cls, 1)
    check_at_least("gem.interformer.n_pma", f.n_pma, 0)
    check_at_least("gem.interformer.n_recent", f.n_recent, 0)
    check_heads("gem.interformer.num_heads", f.num_heads, d)
    check_choice("gem.interformer.gate", f.gate, ("sigmoid", "none"))
    check_choice("gem.interformer.seq_norm", f.seq_norm, ("pre", "post", "none"))
    check_choice("gem.sequence.kind", s.kind, ("pyramid", "full", "none"))
    for key in ("window", "pool_tokens", "chunk", "num_heads"):
        check_at_least(f"gem.sequence.{key}", getattr(s, key), 1)
    for key in ("levels", "ffn_mult", "full_layers", "truncate"):
        check_at_least(f"gem.sequence.{key}", getattr(s, key), 0)
    levels = _pyramid_plan(seq_max_len, s) if s.kind == "pyramid" else []
    if levels or (s.kind == "full" and s.full_layers > 0):
        check_heads("gem.sequence.num_heads", s.num_heads, d)


def merge_sequences(
    parts: list[tuple[torch.Tensor, torch.Tensor]], type_emb: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Several right-padded groups -> one right-padded sequence (group after group) with type embeddings."""
    values = torch.cat([zero_padding(v + type_emb[i], m) for i, (v, m) in enumerate(parts)], dim=1)
    mask = torch.cat([m for _, m in parts], dim=1)
    return compact(values, mask) if len(parts) > 1 else (values, mask)


class GEM(nn.Module):
    def __init__(self, schema: FeatureSchema, emb: EmbeddingConfig, head: HeadConfig, cfg: GEMConfig) -> None:
        super().__init__()
        self.schema, self.cfg = schema, cfg
        self.groups = [g.name for g in schema.sequences] if cfg.use_sequences else []
        max_len = sum(schema.sequence(g).max_len for g in self.groups)
        check_sizes(cfg, emb.d, max_len if self.groups else None)
        self.embedding = FeatureEmbedding(schema, emb)
        n, d = self.embedding.num_tokens, self.embedding.d
        if self.groups:
            self.group_type = nn.Parameter(torch.randn(len(self.groups), d) * 0.02)
            self.encoder = SequenceEncoder(d, max_len, cfg.sequence)
            self.interformer = InterFormer(n, d, cfg.wukong, cfg.interformer)
            head_in = self.interformer.out_dim
        else:
            self.wukong = WukongStack(n, d, cfg.wukong)
            head_in = self.wukong.out_tokens * d
        self.head = MultiSurfaceHead(head_in, len(schema.surfaces), len(schema.tasks), head)
        use_kernel(self, cfg.kernel)

    def forward(self, batch: Batch) -> ModelOutput:
        e: EmbeddedFeatures = self.embedding(batch)
        if self.groups:
            for g in self.groups:
                if g not in e.sequences:
                    raise KeyError(f"GEM: batch has no sequence group {g!r} (groups: {list(e.sequences)})")
            seq, mask = merge_sequences([(e.sequences[g].values, e.sequences[g].mask) for g in self.groups],
                                        self.group_type)
            seq, mask = self.encoder(seq, mask, e.target)
            h, _, s_sum = self.interformer(e.tokens, seq, mask)
            user = s_sum.mean(dim=1)
        else:
            x = self.wukong(e.tokens)
            h, user = x.flatten(1), x.mean(dim=1)
        logits, trunk = self.head(h, batch.surface)
        return ModelOutput(logits=logits, trunk=trunk, extras={"user": user, "ad": e.target, "trunk": trunk})

    def flops_per_example(self, seq_len: int | None = None) -> int:
        """Analytic forward FLOPs per example, every sequence full (``seq_len`` capped per group)."""
        total = self.embedding.flops_per_example(seq_len) + self.head.flops_per_example()
        if self.groups:
            L = sum(self.embedding.seq_len(g, seq_len) for g in self.groups)
            total += self.encoder.flops(L) + self.interformer.flops(self.encoder.out_len(L))
        else:
            total += self.wukong.flops()
        return total
