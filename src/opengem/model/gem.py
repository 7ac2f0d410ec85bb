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

``seq_buckets = K > 1`` runs the sequence path (merge -> encoder -> InterFormer: everything whose cost
grows with the padded length) on up to K buckets of rows of similar history length, each padded only to
its own longest row (:mod:`opengem.ops.length_buckets`), and puts the rows back in the batch's order. Exact:
every op on that path is per row (per-token LayerNorms, attention within a row, per-row gathers and Wukong
interactions; no BatchNorm or batch statistics, which sit in the embedding, before the split), and levels
and RoPE positions never depend on the padded length. The one exception is dropout inside the Wukong MLP
(``gem.wukong.dropout > 0``, 0 in every recipe): in training it draws other masks on other shapes. Where
shapes must not depend on the data (torch.compile, torch.export, FX tracing, ``embedding.pad_to_max_len``)
the whole batch runs as one (K = 1): same numbers, static shapes.
"""

from __future__ import annotations

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
    SequenceTokens,
    check_at_least,
    check_choice,
    check_heads,
    check_widths,
    masked_mean,
)
from opengem.model.flops import linear_flops
from opengem.model.heads import HeadConfig, MultiSurfaceHead, context_columns, head_context
from opengem.model.interformer import GATES, SEQ_NORMS, InterFormer, InterFormerConfig
from opengem.model.output import ModelOutput
from opengem.model.sequence import (
    SEQUENCE_KINDS,
    SequenceEncoder,
    SequenceEncoderConfig,
    _pyramid_plan,
    use_kernel,
)
from opengem.model.wukong import NORMS as WUKONG_NORMS
from opengem.model.wukong import WukongConfig, WukongStack
from opengem.ops.jagged import compact, zero_padding
from opengem.ops.kernel import WITH_FUSED_AND_TRITON
from opengem.ops.length_buckets import length_buckets, restore_rows, take_rows


@dataclass
class GEMConfig:
    """GEM trunk: every size knob lives in the three block configs."""

    wukong: WukongConfig = field(default_factory=WukongConfig)
    interformer: InterFormerConfig = field(default_factory=InterFormerConfig)
    sequence: SequenceEncoderConfig = field(default_factory=SequenceEncoderConfig)
    use_sequences: bool = True  # false = ignore sequence groups: a plain Wukong stack + head
    # ops kernel of every block (opengem.ops.kernel): "fused" = the hand-fused twins (same parameters, same
    # numbers within fp32 rounding, faster), "pytorch" = the reference ops, "triton" = the Triton kernels
    # where a block has one (Wukong's FM product + LayerNorm; CUDA, or TRITON_INTERPRET=1 on CPU for tests)
    # and the fused twins elsewhere
    kernel: str = "fused"
    # the sequence path on this many buckets of rows of similar history length, each padded to its own
    # longest row, not the batch's (exact; see the module docstring); 1 = the whole batch as one
    seq_buckets: int = 1
    # OURS, not in the published GEM (on in configs/small.toml and the iso-FLOP ladder): DCNv2 cross layers
    # on the flattened non-sequence tokens, their output beside the InterFormer's (or the Wukong stack's) in
    # the head's input, as DCNv2's parallel form. Wukong crosses fields through dot products of whole
    # embeddings, so a cross whose latent dimensions weigh differently per surface reaches the head only
    # through its width; an element-wise product keeps each dimension (session 20: GEM missed more of the
    # simulator's feature crosses than DCNv2, benchmarks/missed_signals.py). 0 = none; cross_rank 0 =
    # full-rank W, r = U Vᵀ.
    cross_layers: int = 0
    cross_rank: int = 0
    # OURS: > 0 = the cross branch also reads its own embeddings, this wide, of every single-valued sparse
    # feature with at most ``cross_vocab`` ids and of the surface (opengem.model.cross_attributes says why);
    # ignored without a cross branch
    cross_width: int = 0
    cross_vocab: int = 1000
    # OURS: what of the user's history the cross branch also reads (ignored without a cross branch or without
    # sequence groups): "none"; "mean" = each group's mean event, as DCNv2's cross layers read it; "summary" =
    # the InterFormer's summary of the history (the "user" vector: its summary tokens' mean), so the branch
    # crosses what the sequence path learned about the user with the ad's and the user's attributes
    cross_sequence: str = "none"


CROSS_SEQUENCE = ("none", "mean", "summary")


def check_sizes(cfg: GEMConfig, d: int, seq_max_len: int | None) -> None:
    """Every size knob GEM will use, checked before any of GEM's own blocks is built; a bad one is a
    ConfigError naming its key (``gem.wukong.k``), where the block itself would fail on a shape or divide by
    zero.

    ``d``: the token width (embedding.d); ``seq_max_len``: the merged sequence's length, None when GEM
    reads no sequence (then the [gem.interformer] and [gem.sequence] sizes are not used, and not checked).
    """
    w, f, s = cfg.wukong, cfg.interformer, cfg.sequence
    check_choice("gem.kernel", cfg.kernel, tuple(k.value for k in WITH_FUSED_AND_TRITON))
    check_at_least("gem.seq_buckets", cfg.seq_buckets, 1)
    check_at_least("gem.cross_layers", cfg.cross_layers, 0)
    check_at_least("gem.cross_rank", cfg.cross_rank, 0)
    check_at_least("gem.cross_width", cfg.cross_width, 0)
    check_at_least("gem.cross_vocab", cfg.cross_vocab, 1)
    check_choice("gem.cross_sequence", cfg.cross_sequence, CROSS_SEQUENCE)
    if seq_max_len is None:
        layers_key, layers = "gem.wukong.num_layers", w.num_layers
    else:
        layers_key, layers = "gem.interformer.num_layers", f.num_layers
    check_at_least(layers_key, layers, 1)
    check_at_least("gem.wukong.n_fm", w.n_fm, 1)
    check_at_least("gem.wukong.n_lin", w.n_lin, 0)
    check_at_least("gem.wukong.k", w.k, 1)
    check_widths("gem.wukong.mlp_dims", w.mlp_dims)
    check_choice("gem.wukong.norm", w.norm, WUKONG_NORMS)
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
    check_choice("gem.interformer.gate", f.gate, GATES)
    check_choice("gem.interformer.seq_norm", f.seq_norm, SEQ_NORMS)
    check_choice("gem.sequence.kind", s.kind, SEQUENCE_KINDS)
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
    """Several right-padded groups -> one right-padded sequence (group after group) with type embeddings.
    One group is returned as it is typed (no ``cat``: a copy of the whole padded history, forward and in
    backward, for nothing)."""
    typed = [zero_padding(v + type_emb[i], m) for i, (v, m) in enumerate(parts)]
    if len(parts) == 1:
        return typed[0], parts[0][1]
    return compact(torch.cat(typed, dim=1), torch.cat([m for _, m in parts], dim=1))


class GEM(nn.Module):
    def __init__(self, schema: FeatureSchema, emb: EmbeddingConfig, head: HeadConfig, cfg: GEMConfig) -> None:
        super().__init__()
        self.schema, self.cfg = schema, cfg
        self.groups = [g.name for g in schema.sequences] if cfg.use_sequences else []
        self.embedding = FeatureEmbedding(schema, emb)
        # the merged sequence as forward reads it (embedding.seq_len: with embedding.seq_recent each group is
        # cut to its latest events first), so the pyramid keeps only levels that shrink it (planned on the
        # schema's length, a level would turn 8 events into 13 tokens)
        max_len = sum(self.embedding.seq_len(g) for g in self.groups)
        check_sizes(cfg, emb.d, max_len if self.groups else None)
        n, d = self.embedding.num_tokens, self.embedding.d
        if self.groups:
            self.group_type = nn.Parameter(torch.randn(len(self.groups), d) * 0.02)
            self.encoder = SequenceEncoder(d, max_len, cfg.sequence)
            self.interformer = InterFormer(n, d, cfg.wukong, cfg.interformer)
            head_in = self.interformer.out_dim
        else:
            self.wukong = WukongStack(n, d, cfg.wukong)
            head_in = self.wukong.out_tokens * d
        self.cross_attributes = (CrossAttributes(schema, cfg.cross_width, cfg.cross_vocab)
                                 if cfg.cross_width and cfg.cross_layers else None)
        self._cross_sequence = cfg.cross_sequence if cfg.cross_layers and self.groups else "none"
        history = {"none": 0, "mean": len(self.groups) * d, "summary": d}[self._cross_sequence]
        attributes = self.cross_attributes.out_dim if self.cross_attributes is not None else 0
        cross_dim = n * d + history + attributes
        self.cross = CrossNetwork(cross_dim, cfg.cross_layers, cfg.cross_rank)
        head_in += cross_dim if cfg.cross_layers else 0
        # public: the dense columns the head's context term reads (vertical models rebuild its input)
        self.head_context_columns = columns = context_columns(schema, head.context)
        self.head = MultiSurfaceHead(head_in, len(schema.surfaces), len(schema.tasks), head,
                                     context_dim=columns.stop - columns.start)
        use_kernel(self, cfg.kernel)

    def forward(self, batch: Batch) -> ModelOutput:
        e: EmbeddedFeatures = self.embedding(batch)
        if self.groups:
            for g in self.groups:
                if g not in e.sequences:
                    raise KeyError(f"GEM: batch has no sequence group {g!r} (groups: {list(e.sequences)})")
            seqs = [e.sequences[g] for g in self.groups]
            if self._bucketed():
                h, user = self._bucketed_sequence_path(e.tokens, seqs, e.target)
            else:
                h, user = self._sequence_path(e.tokens, [(s.values, s.mask) for s in seqs], e.target)
        else:
            x = self.wukong(e.tokens)
            h, user = x.flatten(1), x.mean(dim=1)
        if len(self.cross):
            x0 = e.tokens.flatten(1)
            if self._cross_sequence == "mean":
                x0 = torch.cat([x0, *(masked_mean(e.sequences[g]) for g in self.groups)], dim=1)
            elif self._cross_sequence == "summary":
                x0 = torch.cat([x0, user], dim=1)
            x0 = with_cross_attributes(x0, self.cross_attributes, batch)
            h = torch.cat([h, self.cross(x0)], dim=1)
        logits, trunk = self.head(h, batch.surface, head_context(e.dense, self.head_context_columns))
        return ModelOutput(logits=logits, trunk=trunk, extras={"user": user, "ad": e.target, "trunk": trunk})

    def _bucketed(self) -> bool:
        """Whether forward splits the sequence path into length buckets (see the module docstring)."""
        tracing = torch.compiler.is_compiling() or torch.fx._symbolic_trace.is_fx_symbolic_tracing()
        return self.cfg.seq_buckets > 1 and not self.embedding.cfg.pad_to_max_len and not tracing

    def _sequence_path(
        self,
        tokens: torch.Tensor,
        parts: list[tuple[torch.Tensor, torch.Tensor]],
        target: torch.Tensor,
        width: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(head input [B, out_dim], user vector [B, d]) of rows whose groups are ``parts``; ``width`` cuts
        the merged sequence (lossless when no row has more events: merging puts real events first)."""
        seq, mask = merge_sequences(parts, self.group_type)
        if width is not None and seq.shape[1] > width:
            seq, mask = seq[:, :width], mask[:, :width]
        seq, mask = self.encoder(seq, mask, target)
        h, _, s_sum = self.interformer(tokens, seq, mask)
        return h, s_sum.mean(dim=1)

    def _bucketed_sequence_path(
        self, tokens: torch.Tensor, seqs: list[SequenceTokens], target: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_sequence_path` per length bucket, each as wide as its longest merged row; rows restored."""
        lengths = sum(s.mask.sum(1) for s in seqs)  # merged length of each row (the mask: what is padded)
        hs, users, row_lists = [], [], []
        for rows, longest in length_buckets(lengths, self.cfg.seq_buckets):
            width = max(longest, 1)  # a bucket of empty rows keeps one masked slot, as the embedding does
            parts = [take_rows(s.values, s.mask, rows, width) for s in seqs]
            h, user = self._sequence_path(tokens.index_select(0, rows), parts, target.index_select(0, rows),
                                          width)
            hs.append(h)
            users.append(user)
            row_lists.append(rows)
        return restore_rows(hs, row_lists), restore_rows(users, row_lists)

    def flops_per_example(self, seq_len: int | None = None) -> int:
        """Analytic forward FLOPs per example, every sequence full (``seq_len`` capped per group)."""
        total = self._row_flops(seq_len)
        if self.groups:
            total += self.sequence_path_flops(sum(self.embedding.seq_len(g, seq_len) for g in self.groups))
        else:
            total += self.wukong.flops()
        return total

    def _row_flops(self, seq_len: int | None) -> int:
        """Forward FLOPs per row outside the sequence path and the Wukong stack: the embedding (its per-event
        projections at ``seq_len`` events a group), the optional cross branch and the head."""
        embedding = self.embedding.flops_per_example(seq_len)
        return embedding + self.cross.flops_per_example() + self.head.flops_per_example()

    def sequence_path_flops(self, width: int) -> int:
        """Forward FLOPs per row of the sequence path (encoder + InterFormer) at merged padded ``width``."""
        return self.encoder.flops(width) + self.interformer.flops(self.encoder.out_len(width))

    def batch_flops(self, batch: Batch) -> int:
        """Analytic forward FLOPs of ``batch`` as forward runs it: the embedding's per-event projections at
        each row's real lengths (they run on the jagged events), the sequence path at the padded width of
        each bucket it runs (the whole batch's when unbucketed), the rest per row. The reference kernels'
        work exactly (FlopCounterMode agrees, see tests/test_gem_seq_buckets.py); the fused pyramid skips
        chunks without events, so on that path it is an upper bound."""
        B = batch.batch_size
        if not self.groups:
            return self.flops_per_example() * B
        total = self._row_flops(0) * B
        lengths = []
        for g in self.groups:
            n = batch.sequences[g].lengths.detach().to("cpu", torch.long)
            if self.embedding.cfg.seq_recent:  # forward reads only the most recent events
                n = n.clamp(max=self.embedding.cfg.seq_recent)
            total += linear_flops(self.embedding.seq_proj[g].in_features, self.embedding.d) * int(n.sum())
            lengths.append(n)
        merged = sum(lengths)
        if self._bucketed():
            for rows, longest in length_buckets(merged, self.cfg.seq_buckets):
                total += rows.numel() * self.sequence_path_flops(max(longest, 1))
        else:  # each group padded to its longest row (or max_len), the groups side by side
            widths = [self.embedding.seq_len(g) if self.embedding.cfg.pad_to_max_len
                      else max(int(n.max()) if n.numel() else 0, 1) for g, n in zip(self.groups, lengths)]
            total += B * self.sequence_path_flops(sum(widths))
        return total
