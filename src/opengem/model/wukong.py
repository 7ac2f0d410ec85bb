"""Wukong interaction stack (arXiv 2403.02545), with GEM's cross-layer attention as a flagged option.

One layer: ``X' = LN(concat(FMB(X), LCB(X)) + residual(X))`` on tokens X ∈ R^{n×d}:
  FMB(X) = reshape(MLP(LN(flatten(X · (Xᵀ Y)))))   to nF tokens  (optimized FM: Y ∈ R^{n×k}, k ≪ n, so the
           interaction costs O(n·d·k) instead of O(n²·d)); with ``input_attentive_y`` Y is computed from X by
           a small MLP, as the paper's attentive variant;
  LCB(X) = W_L · X along the token axis            to nL tokens;
  residual = X, or W_R · X along the token axis when n ≠ nF + nL.

Cross-layer attention (``cross_layer_attention``) is OUR interpretation of GEM's unpublished "cross-layer
attention connections": after each layer its output tokens attend (multi-head, pre-LN, residual) over the
concatenated outputs of all earlier layers including the input tokens. On by default (GEM); plain Wukong
(the registry's "wukong") turns it off.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from opengem.model.sequence import MultiHeadAttention
from opengem.ops import fmb as fmb_ops
from opengem.ops.cpu_autocast import fp32_under_cpu_autocast
from opengem.ops.kernel import WITH_FUSED_AND_TRITON, Kernel

NORMS = ("layer", "none")  # WukongConfig.norm's choices


@dataclass
class WukongConfig:
    """Wukong sizes. Defaults follow the paper's form (nF = nL, small rank k, one hidden MLP layer)."""

    num_layers: int = 2  # plain Wukong depth (GEM with sequences: one Wukong layer per InterFormer layer)
    n_fm: int = 8  # nF: tokens produced by the factorization machine block
    n_lin: int = 8  # nL: tokens produced by the linear compress block
    k: int = 4  # rank of Y in the optimized FM (k << n)
    mlp_dims: list[int] = field(default_factory=lambda: [128])  # FMB MLP hidden widths
    # GEM's cross-layer attention (our interpretation). On by default (GEM); the registry's "wukong" turns it
    # off. Defaulting here (not in GEMConfig) keeps it on when a TOML sets only some [gem.wukong] keys.
    cross_layer_attention: bool = True
    cla_heads: int = 1  # heads of the cross-layer attention
    input_attentive_y: bool = False  # Y = MLP(flatten(X)) instead of a learned constant
    y_hidden: int = 32  # hidden width of the input-attentive Y MLP
    pyramid: list[int] = field(default_factory=list)  # output token count per layer (empty = nF + nL each)
    dropout: float = 0.0  # dropout inside the FMB MLP
    # the LayerNorm over each output token (the paper's), or "none" (OURS): at 4-wide tokens a LayerNorm
    # discards each token's mean and length, two of its four numbers (session 34: at the iso-FLOP study's
    # 1.58e10 budget GEM without this norm and the InterFormer's learned the history on more of its seeds)
    norm: str = "layer"


def layer_token_counts(cfg: WukongConfig, num_layers: int) -> list[tuple[int, int]]:
    """(nF, nL) per layer: constant, or the pyramid's counts split in the nF : nL ratio."""
    if not cfg.pyramid:
        return [(cfg.n_fm, cfg.n_lin)] * num_layers
    if len(cfg.pyramid) != num_layers:
        raise ValueError(f"wukong.pyramid: {len(cfg.pyramid)} entries for {num_layers} layers")
    out = []
    for i, n in enumerate(cfg.pyramid):
        if n < 2:
            raise ValueError(f"wukong.pyramid[{i}]: need at least 2 tokens (one FM, one linear), got {n}")
        nf = min(max(1, round(n * cfg.n_fm / (cfg.n_fm + cfg.n_lin))), n - 1)
        out.append((nf, n - nf))
    return out


def _mlp(dims: list[int], dropout: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers += [nn.ReLU(), nn.Dropout(dropout)] if dropout else [nn.ReLU()]
    return nn.Sequential(*layers)


def _mlp_flops(dims: list[int]) -> int:
    return sum(2 * a * b for a, b in zip(dims[:-1], dims[1:]))


class WukongLayer(nn.Module):
    """One Wukong layer: n_in tokens -> n_fm + n_lin tokens."""

    kernels = WITH_FUSED_AND_TRITON  # use_kernel: the FM product + LayerNorm have a Triton twin

    def __init__(self, n_in: int, d: int, n_fm: int, n_lin: int, cfg: WukongConfig) -> None:
        super().__init__()
        if cfg.k < 1 or n_fm < 1 or n_lin < 0:
            raise ValueError(f"wukong: need k >= 1, n_fm >= 1, n_lin >= 0 (got {cfg.k}, {n_fm}, {n_lin})")
        self.n_in, self.d, self.n_fm, self.n_lin, self.k = n_in, d, n_fm, n_lin, cfg.k
        self.n_out = n_fm + n_lin
        if cfg.input_attentive_y:
            self.y_dims = [n_in * d, cfg.y_hidden, n_in * cfg.k]
            self.y_mlp: nn.Module | None = _mlp(self.y_dims, 0.0)
            self.register_parameter("Y", None)
        else:
            self.y_mlp = None
            self.Y = nn.Parameter(torch.randn(n_in, cfg.k) / n_in**0.5)
        self.fm_ln = nn.LayerNorm(n_in * cfg.k)
        self.mlp_dims = [n_in * cfg.k, *cfg.mlp_dims, n_fm * d]
        self.mlp = _mlp(self.mlp_dims, cfg.dropout)
        self.W_L = nn.Parameter(torch.randn(n_lin, n_in) / n_in**0.5)
        self.W_R = nn.Parameter(torch.randn(self.n_out, n_in) / n_in**0.5) if self.n_out != n_in else None
        if cfg.norm not in NORMS:
            raise ValueError(f"wukong.norm: {cfg.norm!r} is not one of {', '.join(NORMS)}")
        self.ln = nn.LayerNorm(d) if cfg.norm == "layer" else None
        self.dropout = cfg.dropout
        self.kernel = Kernel.PYTORCH  # the ops kernel (opengem.ops.fmb); GEM sets it via use_kernel
        self.linear_kernel = Kernel.PYTORCH  # the MLP's products (opengem.ops.linear; train.cpu_linear)

    def _y(self, x: torch.Tensor) -> torch.Tensor:
        if self.y_mlp is None:
            return self.Y
        return self.y_mlp(x.flatten(1)).view(-1, self.n_in, self.k)

    def fm(self, x: torch.Tensor) -> torch.Tensor:
        """X · (Xᵀ Y): [B, n, k], the optimized factorization machine."""
        return fmb_ops.fm_product(x, self._y(x), kernel=self.kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] != self.n_in:
            raise ValueError(f"wukong layer: expected {self.n_in} tokens, got {x.shape[1]}")
        B = x.shape[0]
        if self.training and self.dropout > 0:  # the ops have no dropout: run the MLP module itself
            fmb = self.mlp(self.fm_ln(self.fm(x).flatten(1)))
        else:
            linears = [m for m in self.mlp if isinstance(m, nn.Linear)]
            fmb = fmb_ops.fmb(x, self._y(x), self.fm_ln.weight, self.fm_ln.bias, [m.weight for m in linears],
                              [m.bias for m in linears], self.fm_ln.eps, kernel=self.kernel,
                              linear_kernel=self.linear_kernel)
        combine_kernel = Kernel.FUSED if self.kernel is Kernel.TRITON else self.kernel  # no Triton combine
        ln = self.ln
        norm = (ln.weight, ln.bias, ln.eps) if ln is not None else (None, None, 0.0)  # eps unused without LN
        return fmb_ops.combine(fmb.view(B, self.n_fm, self.d), x, self.W_L, self.W_R, *norm,
                               kernel=combine_kernel)

    def flops(self) -> int:
        n, d, k = self.n_in, self.d, self.k
        total = 4 * n * d * k + _mlp_flops(self.mlp_dims) + 2 * self.n_lin * n * d
        if self.y_mlp is not None:
            total += _mlp_flops(self.y_dims)
        if self.W_R is not None:
            total += 2 * self.n_out * n * d
        return total


class CrossLayerAttention(nn.Module):
    """Our cross-layer attention: a layer's tokens attend over all earlier layers' tokens (pre-LN)."""

    def __init__(self, d: int, num_heads: int) -> None:
        super().__init__()
        self.ln_q, self.ln_kv = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = MultiHeadAttention(d, num_heads)
        self.kernel = Kernel.PYTORCH

    @fp32_under_cpu_autocast
    def forward(self, x: torch.Tensor, memory: list[torch.Tensor]) -> torch.Tensor:
        # fused: the first layer's memory is the input tokens alone, read as they are (the reference copies
        # them through a one-element cat, forward and backward). K/V of earlier layers cannot be kept
        # running across layers: every layer has its own ln_kv and kv weights, so each reads memory afresh.
        one = self.kernel is Kernel.FUSED and len(memory) == 1
        mem = self.ln_kv(memory[0] if one else torch.cat(memory, dim=1))
        return x + self.attn(self.ln_q(x), mem)

    def flops(self, n: int, m: int) -> int:
        return self.attn.flops(n, m)


class WukongStack(nn.Module):
    """Stacked Wukong layers on [B, n, d] tokens; ``out_tokens`` tokens come out of the last layer."""

    def __init__(self, n_in: int, d: int, cfg: WukongConfig, num_layers: int | None = None) -> None:
        super().__init__()
        L = cfg.num_layers if num_layers is None else num_layers
        if L < 1:
            raise ValueError(f"wukong.num_layers: must be >= 1, got {L}")
        self.cfg = cfg
        self.layers = nn.ModuleList()
        self.cla = nn.ModuleList()
        n = n_in
        for nf, nl in layer_token_counts(cfg, L):
            self.layers.append(WukongLayer(n, d, nf, nl, cfg))
            if cfg.cross_layer_attention:
                self.cla.append(CrossLayerAttention(d, cfg.cla_heads))
            n = nf + nl
        self.out_tokens = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        memory = [x]
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if self.cfg.cross_layer_attention:
                x = self.cla[i](x, memory)
                memory.append(x)
        return x

    def flops(self) -> int:
        total, mem = 0, self.layers[0].n_in
        for i, layer in enumerate(self.layers):
            total += layer.flops()
            if self.cfg.cross_layer_attention:
                total += self.cla[i].flops(layer.n_out, mem)
                mem += layer.n_out
        return total
