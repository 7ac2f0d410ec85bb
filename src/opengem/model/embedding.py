"""FeatureEmbedding: schema features -> tokens of one width d, on TorchRec tables.

Table layout (the part DistributedModelParallel shards):

- ``self.ebc``: one ``EmbeddingBagCollection`` holding every table used only by non-sequence sparse
  features. Its tables are always SUM-pooled; features declared ``pooling = "mean"`` are divided by their
  length here, because TorchRec fixes pooling per *table* while our schema declares it per *feature*
  (two features sharing a table may pool differently).
- ``self.ecs``: ``EmbeddingCollection`` (unpooled) modules, one per distinct embedding dim (TorchRec
  requires one dim per EmbeddingCollection), keyed ``"d<dim>"``. They hold every table used by a sequence
  id field. A non-sequence sparse feature whose table is also used by a sequence (the ad being ranked and
  the ads in the history) is looked up through the EC too and pooled here, so the shared table is ONE
  parameter that both the target and the history train.

Tokens ([B, N, d], in this order): sparse tokens, dense tokens, the surface token. A sparse feature with
dim == d is its own token; a bigger one is projected; smaller ones are concatenated in schema order until
the group reaches d and the concat is projected to d (Wukong's treatment of small embeddings), except
target features, which always keep a token of their own so that ``target`` is the ad's alone.

Sequence groups: per event concat(id-field embeddings, dense fields) -> Linear -> d on the jagged
values, then padded with ``opengem.ops.jagged.jagged_to_padded`` (zeros where masked). Nothing in forward
assigns into a tensor in place (TorchRec's train pipeline FX-traces the model).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_configs import EmbeddingConfig as TrecEmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor

from opengem.config import ConfigError
from opengem.data.batch import Batch
from opengem.data.schema import SEQ_SEP, FeatureSchema
from opengem.model.flops import linear_flops, mlp_flops
from opengem.ops.jagged import gather_last, jagged_to_padded


# --------------------------------------------------------------------------- config checks
# A model's size knobs are checked where the model is built, before any tensor is made, so that a bad value
# (model.embedding.d=-4) is one line naming the key instead of a shape error deep in torch. Keys are named
# relative to the model section ("embedding.d"); registry.build_model puts the section ("model.") in front.
def check_at_least(key: str, value: int | float, minimum: int) -> None:
    if value < minimum:
        raise ConfigError(f"{key}: must be >= {minimum} (got {value!r})")


def check_widths(key: str, widths: list[int]) -> None:
    """Every hidden width of an MLP is a positive number of units."""
    bad = [w for w in widths if w < 1]
    if bad:
        raise ConfigError(f"{key}: every width must be >= 1 (got {list(widths)!r})")


def check_choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(allowed)}")


def check_heads(key: str, heads: int, d: int) -> None:
    """Attention heads split the token width ``d`` (model.embedding.d) evenly."""
    check_at_least(key, heads, 1)
    if d % heads:
        divisors = [h for h in range(1, d + 1) if d % h == 0]
        raise ConfigError(f"{key}: must divide embedding.d = {d} (got {heads}; allowed: "
                          f"{', '.join(map(str, divisors[:12]))}{', ...' if len(divisors) > 12 else ''})")


@dataclass
class EmbeddingConfig:
    d: int = 32  # token width
    dense_tokens: int = 1  # dense features -> MLP -> this many tokens of width d (0 = no dense tokens)
    dense_hidden: int = 0  # hidden width of the dense MLP (0 = d)
    group_small: bool = True  # Wukong-style: features with dim < d are concatenated in groups, projected to d
    surface_token: bool = True  # the surface is a token
    # sparse features that are "the ad being ranked"; empty = auto: single-valued sparse features whose
    # table is shared with a sequence id field
    target_features: list[str] = field(default_factory=list)
    # pad sequences to the schema's max_len instead of the batch's longest row (static shapes for compile)
    pad_to_max_len: bool = False
    # read only each sequence's N most recent events (0 = all of them): production rankers cut histories to
    # their latest events, which predict best and which every model pays for per event; a model size knob
    # (every family's lookups and per-event projection scale with it, GEM's sequence path too)
    seq_recent: int = 0
    # table init: rows ~ U(-s, s) with s = init_scale / sqrt(dim) when > 0; 0 = TorchRec's default
    # U(+-sqrt(1 / rows)), which makes rows of a 1M-row table ~1000x smaller than those of a 10-row one, so
    # big-vocabulary tokens (user, ad) start near zero beside small-vocabulary and dense tokens
    init_scale: float = 0.0
    # standardise dense features and sequence dense fields with running statistics (RunningNorm) before
    # they meet learned weights: raw dense inputs come in arbitrary units (a log-seconds gap ~10 made up
    # almost all of a per-event token at init, drowning the item and category embeddings)
    dense_norm: bool = False


@dataclass
class SequenceTokens:
    values: torch.Tensor  # [B, L, d] padded, oldest event first, zeros where masked
    mask: torch.Tensor  # [B, L] bool, True = real event
    lengths: torch.Tensor  # [B] int64


@dataclass
class EmbeddedFeatures:
    tokens: torch.Tensor  # [B, N, d] non-sequence tokens (sparse (grouped) + dense tokens + surface token)
    target: torch.Tensor  # [B, d] the ranked ad's token (mean of target tokens; mean of all tokens if none)
    sequences: dict[str, SequenceTokens]  # per sequence group
    pooled: dict[str, torch.Tensor]  # per sparse feature its raw pooled embedding [B, dim_f]
    dense: torch.Tensor | None = None  # [B, Dd] the dense features as the model sees them (normalised or raw)


@dataclass(frozen=True)
class _TokenSpec:
    features: tuple[str, ...]
    in_dim: int


class FeatureEmbedding(nn.Module):
    def __init__(self, schema: FeatureSchema, cfg: EmbeddingConfig) -> None:
        super().__init__()
        check_at_least("embedding.d", cfg.d, 1)
        check_at_least("embedding.dense_tokens", cfg.dense_tokens, 0)
        check_at_least("embedding.dense_hidden", cfg.dense_hidden, 0)
        check_at_least("embedding.init_scale", cfg.init_scale, 0)
        check_at_least("embedding.seq_recent", cfg.seq_recent, 0)
        self.schema = schema
        self.cfg = cfg
        self.d = d = cfg.d
        tables = schema.tables()

        def init_range(dim: int) -> dict[str, float]:
            # weight_init_min/max (not init_fn): sharded TorchRec kernels initialise from these
            if not cfg.init_scale:
                return {}
            r = cfg.init_scale / dim**0.5
            return {"weight_init_min": -r, "weight_init_max": r}

        seq_tables = {f.table_name for g in schema.sequences for f in g.id_fields}
        unknown = [n for n in cfg.target_features if n not in schema.sparse_names]
        if unknown:
            raise ConfigError(
                f"embedding.target_features: {unknown} are not sparse features of schema "
                f"{schema.name!r} (known: {schema.sparse_names})"
            )
        # auto: single-valued features on a table a sequence also uses (the ranked ad's id, category, ...).
        # A multi-valued feature on such a table (e.g. the user's interest categories) describes the user,
        # not the ad: counting it would blur the target-attention query with a user signal.
        self.target_features: list[str] = list(cfg.target_features) or [
            f.name for f in schema.sparse if f.table_name in seq_tables and not f.multi_valued
        ]

        # --- TorchRec modules: EBC for tables no sequence uses, ECs (one per dim) for the rest
        ebc_feats: dict[str, list[str]] = {}
        ec_feats: dict[str, list[str]] = {}
        for f in schema.sparse:
            (ec_feats if f.table_name in seq_tables else ebc_feats).setdefault(f.table_name, []).append(
                f.name
            )
        for g in schema.sequences:
            for f in g.id_fields:
                ec_feats.setdefault(f.table_name, []).append(g.column(f.name))
        self._ebc_features = [n for names in ebc_feats.values() for n in names]
        # True once TorchRec has sharded ``ebc`` (train/parallelize.py): a sharded EBC permutes its own input
        # in its input all-to-all, so it takes the batch's whole KJT in schema order, every call alike; the
        # train pipeline (train/pipeline.py) starts that all-to-all on ``batch.sparse`` itself
        self.ebc_takes_whole_batch = False
        self.ebc: EmbeddingBagCollection | None = None
        if ebc_feats:
            self.ebc = EmbeddingBagCollection(
                tables=[
                    EmbeddingBagConfig(
                        name=t,
                        num_embeddings=tables[t][0],
                        embedding_dim=tables[t][1],
                        feature_names=names,
                        pooling=PoolingType.SUM,
                        **init_range(tables[t][1]),
                    )
                    for t, names in ebc_feats.items()
                ]
            )
        by_dim: dict[int, list[TrecEmbeddingConfig]] = {}
        for t, names in ec_feats.items():
            vocab, dim = tables[t]
            by_dim.setdefault(dim, []).append(
                TrecEmbeddingConfig(name=t, num_embeddings=vocab, embedding_dim=dim, feature_names=names,
                                    **init_range(dim))
            )
        self.ecs = nn.ModuleDict(
            {f"d{dim}": EmbeddingCollection(tables=cfgs) for dim, cfgs in by_dim.items()}
        )
        self._ec_features: dict[str, list[str]] = {
            f"d{dim}": [n for c in cfgs for n in c.feature_names] for dim, cfgs in by_dim.items()
        }
        self._sparse_in_ec = {f.name for f in schema.sparse if f.table_name in seq_tables}

        # --- sparse features -> tokens of width d
        specs: list[_TokenSpec] = []
        pending: list[str] = []
        pending_dim = 0
        for f in schema.sparse:
            if f.dim < d and cfg.group_small and f.name not in self.target_features:
                pending.append(f.name)
                pending_dim += f.dim
                if pending_dim >= d:
                    specs.append(_TokenSpec(tuple(pending), pending_dim))
                    pending, pending_dim = [], 0
            else:
                specs.append(_TokenSpec((f.name,), f.dim))
        if pending:
            specs.append(_TokenSpec(tuple(pending), pending_dim))
        self._token_specs = specs
        self.token_proj = nn.ModuleList(
            [nn.Identity() if s.in_dim == d else nn.Linear(s.in_dim, d) for s in specs]
        )
        self._target_token_idx = [i for i, s in enumerate(specs) if s.features[0] in self.target_features]

        # --- dense features -> dense_tokens tokens
        n_dense = schema.num_dense_inputs  # dense features + derived time features
        self._dense_mlp_dims: list[int] = []
        self.dense_mlp: nn.Module | None = None
        if n_dense and cfg.dense_tokens:
            hidden = cfg.dense_hidden or d
            self._dense_mlp_dims = [n_dense, hidden, cfg.dense_tokens * d]
            self.dense_mlp = nn.Sequential(
                nn.Linear(n_dense, hidden), nn.ReLU(), nn.Linear(hidden, cfg.dense_tokens * d)
            )
        self.num_dense_tokens = cfg.dense_tokens if self.dense_mlp is not None else 0
        self.dense_bn = RunningNorm(n_dense) if cfg.dense_norm and n_dense else None
        self.seq_dense_bn = nn.ModuleDict({
            g.name: RunningNorm(len(g.dense_fields))
            for g in schema.sequences if cfg.dense_norm and g.dense_fields
        })

        self.surface_emb = nn.Embedding(len(schema.surfaces), d) if cfg.surface_token else None
        self.num_sparse_tokens = len(specs)
        self.num_tokens = self.num_sparse_tokens + self.num_dense_tokens + (1 if cfg.surface_token else 0)
        if self.num_tokens == 0:
            raise ConfigError(f"embedding: schema {schema.name!r} with this embedding config yields no "
                              "tokens (it has no sparse features): set embedding.surface_token = true, or "
                              "embedding.dense_tokens >= 1 if it has dense features")

        # --- sequence groups: per-event Linear(concat(fields)) -> d
        self._seq_in_dim = {
            g.name: sum(f.dim for f in g.id_fields) + len(g.dense_fields) for g in schema.sequences
        }
        self.seq_proj = nn.ModuleDict(
            {g.name: nn.Linear(self._seq_in_dim[g.name], d) for g in schema.sequences}
        )

    # ------------------------------------------------------------------ forward
    def forward(self, batch: Batch) -> EmbeddedFeatures:
        B = batch.batch_size
        if self.cfg.seq_recent and not self.cfg.pad_to_max_len:  # static shapes cut after padding instead
            batch = dataclasses.replace(
                batch, sequences={g: sb.recent(self.cfg.seq_recent) for g, sb in batch.sequences.items()})
        sparse = batch.sparse.to_dict() if self.schema.sparse else {}
        for name in self.schema.sparse_names:
            if name not in sparse:
                raise KeyError(f"batch.sparse has no feature {name!r} (keys: {list(sparse)})")

        pooled: dict[str, torch.Tensor] = {}
        if self.ebc is not None:
            names = self.schema.sparse_names if self.ebc_takes_whole_batch else self._ebc_features
            kt = self.ebc(_select(batch.sparse, names)).to_dict()
            for name in self._ebc_features:
                pooled[name] = kt[name]
        seq_lookups: dict[str, JaggedTensor] = {}
        for key, ec in self.ecs.items():
            out = ec(self._ec_input(batch, sparse, self._ec_features[key]))
            for name in self._ec_features[key]:
                if name in self._sparse_in_ec:
                    jt = out[name]
                    pooled[name] = _sum_pool(jt.values(), jt.lengths(), B)
                else:
                    seq_lookups[name] = out[name]
        for f in self.schema.sparse:
            if f.pooling == "mean":
                n = sparse[f.name].lengths().clamp(min=1).to(pooled[f.name].dtype)
                pooled[f.name] = pooled[f.name] / n[:, None]

        toks = [
            proj(
                torch.cat([pooled[n] for n in spec.features], dim=1)
                if len(spec.features) > 1
                else pooled[spec.features[0]]
            )
            for spec, proj in zip(self._token_specs, self.token_proj)
        ]
        if self._target_token_idx:
            target = torch.stack([toks[i] for i in self._target_token_idx], dim=1).mean(dim=1)
        else:
            target = None
        dense_in = batch.dense
        n_dense = self.schema.num_dense_inputs
        if self.dense_bn is not None and dense_in.dim() == 2 and dense_in.shape[1] == n_dense:
            dense_in = self.dense_bn(dense_in)
        if self.dense_mlp is not None:
            if batch.dense.dim() != 2 or batch.dense.shape[1] != n_dense:
                raise ValueError(
                    f"batch.dense has shape {tuple(batch.dense.shape)}; schema {self.schema.name!r} "
                    f"declares {n_dense} dense inputs {self.schema.dense_input_names}"
                )
            dense = self.dense_mlp(dense_in).view(B, self.num_dense_tokens, self.d)
            toks = toks + list(dense.unbind(1))
        if self.surface_emb is not None:
            toks = toks + [self.surface_emb(batch.surface)]
        tokens = torch.stack(toks, dim=1)
        if target is None:
            target = tokens.mean(dim=1)

        sequences = {g.name: self._sequence_tokens(batch, g.name, seq_lookups) for g in self.schema.sequences}
        return EmbeddedFeatures(tokens=tokens, target=target, sequences=sequences, pooled=pooled,
                                dense=dense_in)

    def _ec_input(self, batch: Batch, sparse: dict[str, JaggedTensor], names: list[str]) -> KeyedJaggedTensor:
        values, lengths = [], []
        for name in names:
            if SEQ_SEP in name:
                g, f = name.split(SEQ_SEP, 1)
                if g not in batch.sequences:
                    raise KeyError(f"batch.sequences has no group {g!r} (groups: {list(batch.sequences)})")
                sb = batch.sequences[g]
                if f not in sb.ids:
                    raise KeyError(f"batch.sequences[{g!r}].ids has no field {f!r} (fields: {list(sb.ids)})")
                values.append(sb.ids[f])
                lengths.append(sb.lengths)
            else:
                values.append(sparse[name].values())
                lengths.append(sparse[name].lengths())
        return KeyedJaggedTensor.from_lengths_sync(
            keys=names, values=torch.cat(values), lengths=torch.cat(lengths)
        )

    def _sequence_tokens(self, batch: Batch, group: str, lookups: dict[str, JaggedTensor]) -> SequenceTokens:
        g = self.schema.sequence(group)
        sb = batch.sequences[group]
        lengths = sb.lengths
        parts = [lookups[g.column(f.name)].values() for f in g.id_fields]
        for f in g.dense_fields:
            if f.name not in sb.dense:
                raise KeyError(f"batch.sequences[{group!r}].dense has no field {f.name!r}")
            parts.append(sb.dense[f.name].to(parts[0].dtype)[:, None])
        n = parts[0].shape[0]
        for f, p in zip([*g.id_fields, *g.dense_fields], parts):
            if p.shape[0] != n:
                raise ValueError(
                    f"sequence {group!r}: field {f.name!r} has {p.shape[0]} values, "
                    f"{g.id_fields[0].name!r} has {n}"
                )
        if group in self.seq_dense_bn:  # the dense fields are the last k parts
            k = len(g.dense_fields)
            parts = parts[:-k] + [self.seq_dense_bn[group](torch.cat(parts[-k:], dim=1))]
        flat = self.seq_proj[group](torch.cat(parts, dim=1))
        L = g.max_len if self.cfg.pad_to_max_len else max(int(lengths.max()) if lengths.numel() else 0, 1)
        values, mask = jagged_to_padded(flat, lengths, L)
        k = self.cfg.seq_recent
        if k and k < L:  # only with pad_to_max_len: forward already cut the jagged batch otherwise
            values, mask = gather_last(values, lengths, k)
            lengths = lengths.clamp(max=k)
        return SequenceTokens(values=values, mask=mask, lengths=lengths)

    # ------------------------------------------------------------------ accounting
    def seq_len(self, group: str, seq_len: int | None = None) -> int:
        """Full length of ``group`` used for FLOPs: ``seq_len`` if given (capped at max_len), else max_len."""
        L = self.schema.sequence(group).max_len
        if self.cfg.seq_recent:
            L = min(L, self.cfg.seq_recent)
        return L if seq_len is None else min(seq_len, L)

    def flops_per_example(self, seq_len: int | None = None) -> int:
        """Token projections, dense MLP and per-event sequence projections; lookups count 0 FLOPs."""
        total = sum(linear_flops(s.in_dim, self.d) for s in self._token_specs if s.in_dim != self.d)
        if self._dense_mlp_dims:
            total += mlp_flops(self._dense_mlp_dims)
        for g in self.schema.sequences:
            total += linear_flops(self._seq_in_dim[g.name], self.d, rows=self.seq_len(g.name, seq_len))
        return total


class RunningNorm(nn.Module):
    """(x - mean) / std with running statistics, used the same way in training and evaluation.

    Not BatchNorm: canonical data is time-ordered and a batch is a contiguous slice of one row group, so
    batch statistics are not the population's (hour of day is nearly constant within a batch; its batch
    variance is ~1000x too small). BatchNorm then trains on one scale and evaluates on another. Here the
    statistics are a running average over batches (exact mean of the first 1/momentum batches, then an
    exponential average) and every forward normalises with them, so train and eval agree. Buffers are
    updated in place without Python branching on tensors (FX-traceable).
    """

    def __init__(self, n: int, momentum: float = 0.01, eps: float = 1e-5) -> None:
        super().__init__()
        self.momentum, self.eps = momentum, eps
        self.register_buffer("mean", torch.zeros(n))
        self.register_buffer("var", torch.ones(n))
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0] > 0:
            with torch.no_grad():
                xf = x.detach().float()
                w = torch.clamp(1.0 / (self.count + 1.0), min=self.momentum)
                self.mean.add_(w * (xf.mean(0) - self.mean))
                self.var.add_(w * ((xf - self.mean).pow(2).mean(0) - self.var))
                self.count.add_(1.0)
        return (x - self.mean) / torch.sqrt(self.var + self.eps)


def _select(kjt: KeyedJaggedTensor, names: list[str]) -> KeyedJaggedTensor:
    """The sub-KJT of ``names`` (by key, so a loader's key order never matters)."""
    keys = kjt.keys()
    if keys == names:
        return kjt
    return kjt.permute([keys.index(n) for n in names])


def _sum_pool(values: torch.Tensor, lengths: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Sum jagged rows [sum(lengths), D] -> [B, D] without in-place writes (index_add is out-of-place)."""
    rows = torch.repeat_interleave(
        torch.arange(batch_size, device=values.device), lengths, output_size=values.shape[0]
    )
    return values.new_zeros(batch_size, values.shape[1]).index_add(0, rows, values)


def masked_mean(seq: SequenceTokens) -> torch.Tensor:
    """Mean of a sequence's real events [B, d] (zeros for an empty history); padding is already zero."""
    n = seq.lengths.clamp(min=1).to(seq.values.dtype)
    return seq.values.sum(dim=1) / n[:, None]
