"""InterFormer layers (arXiv 2411.09852) with Wukong as the interaction backbone (GEM's choice).

Per layer l, from the layer's inputs X (non-sequence tokens) and S (sequence, CLS tokens first):
  Cross Arch        X_sum = gate(compress_tokens(X))                        n_cls tokens
                    S_sum = gate([CLS ∥ PMA(S) ∥ recent-K(S)])              n_cls + n_pma + n_recent tokens
  Interaction Arch  X' = Wukong layer on [X ∥ S_sum]  (+ our cross-layer attention when enabled)
  Sequence Arch     S' = MHA(PFFN(X_sum, S)) with RoPE and key-padding masks; PFFN applies a per-example
                    d×d weight generated from X_sum to every sequence token.
Before layer 1 a summary of X is prepended to the sequence as the n_cls CLS tokens; the head reads
flatten([X_sum ∥ S_sum]) from a final Cross Arch on the last layer's outputs.

Unpublished details, each OURS and behind a flag: the gate (``gate="sigmoid"``: x ⊙ σ(W x) per token, or
"none"), the norms inside the Sequence Arch (``seq_norm="pre"|"post"|"none"``), and the residuals around
PFFN and MHA (``seq_residual``). RoPE positions count from the first CLS token, so a row's positions never
depend on how much padding its batch has.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from opengem.model.sequence import MultiHeadAttention, PooledAttention
from opengem.model.wukong import CrossLayerAttention, WukongConfig, WukongLayer, layer_token_counts
from opengem.ops.cpu_autocast import fp32_under_cpu_autocast
from opengem.ops.jagged import ensure_nonempty, gather_last, zero_padding
from opengem.ops.kernel import Kernel

GATES = ("sigmoid", "none")  # InterFormerConfig.gate
SEQ_NORMS = ("pre", "post", "none")  # InterFormerConfig.seq_norm


@dataclass
class InterFormerConfig:
    """InterFormer sizes and our flags for its unpublished details. Defaults: the paper's 4/2/2 summaries."""

    num_layers: int = 2  # InterFormer layers (each holds one Wukong layer as its Interaction Arch)
    num_heads: int = 2  # heads of the Sequence Arch self-attention and of PMA
    n_cls: int = 4  # CLS tokens = size of X_sum (prepended to the sequence)
    n_pma: int = 2  # PMA seeds (pooling by multi-head attention) in S_sum
    n_recent: int = 2  # last K real events in S_sum
    use_pffn: bool = True  # personalized FFN before the MHA
    use_rope: bool = True  # rotary positions in the Sequence Arch MHA
    rope_base: float = 10000.0
    gate: str = "sigmoid"  # ours: "sigmoid" (x * sigmoid(W x)) or "none"
    seq_norm: str = "pre"  # ours: LayerNorm placement in the Sequence Arch: pre | post | none
    seq_residual: bool = True  # ours: residual connections around PFFN and MHA


class Gate(nn.Module):
    """Self-gating of summary tokens (our form): x ⊙ σ(W x)."""

    def __init__(self, d: int, kind: str) -> None:
        super().__init__()
        if kind not in GATES:
            raise ValueError(f"interformer.gate: {kind!r} is not one of {', '.join(GATES)}")
        self.proj = nn.Linear(d, d) if kind == "sigmoid" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.proj is None else x * torch.sigmoid(self.proj(x))

    def flops(self, n: int) -> int:
        return 0 if self.proj is None else 2 * n * self.proj.in_features * self.proj.out_features


class TokenCompress(nn.Module):
    """Linear compression along the token axis (n tokens -> m tokens), then the gate."""

    def __init__(self, n: int, m: int, d: int, gate: str) -> None:
        super().__init__()
        self.W = nn.Parameter(torch.randn(m, n) / n**0.5)
        self.gate = Gate(d, gate)
        self.n, self.m, self.d = n, m, d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(torch.einsum("mn,bnd->bmd", self.W, x))

    def flops(self) -> int:
        return 2 * self.m * self.n * self.d + self.gate.flops(self.m)


class CrossArch(nn.Module):
    """Summaries that let the interaction and sequence arches read each other."""

    def __init__(self, n_x: int, d: int, cfg: InterFormerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.compress = TokenCompress(n_x, cfg.n_cls, d, cfg.gate)
        self.seeds = nn.Parameter(torch.randn(cfg.n_pma, d) * 0.02)
        self.pma = PooledAttention(d, cfg.num_heads) if cfg.n_pma else None
        self.gate_s = Gate(d, cfg.gate)
        self.n_s = cfg.n_cls + cfg.n_pma + cfg.n_recent
        self.kernel = Kernel.PYTORCH

    @fp32_under_cpu_autocast
    def forward(
        self, x: torch.Tensor, s: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        x_sum = self.compress(x)
        fused = self.kernel is Kernel.FUSED and cfg.n_recent
        # the reference builds its parts in its original order (slice, PMA, gather): autograd then sums the
        # sequence's gradient in the same order as before, so the reference's numbers stay bit for bit
        cls, recent = self._cls_and_recent(s, mask) if fused else (s[:, : cfg.n_cls], None)
        parts = [cls]
        if self.pma is not None:
            # an add, not expand(): a no-grad view of a parameter breaks FlopCounterMode's module hooks
            seeds = s.new_zeros(s.shape[0], 1, 1) + self.seeds
            parts.append(self.pma(seeds, s, mask)[0])  # always valid: the CLS keys are real
        if cfg.n_recent:
            parts.append(recent if fused else gather_last(s, mask.sum(1), cfg.n_recent)[0])
        return x_sum, self.gate_s(torch.cat(parts, dim=1))

    def _cls_and_recent(self, s: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The CLS tokens and the last ``n_recent`` real tokens in ONE gather.

        The reference slices the CLS tokens and gathers the recent ones: in backward the slice fills a
        zero gradient the size of the whole sequence and the gather fills another; one gather of both
        index sets fills one. Same indices and zeroing as ``gather_last`` (the tests pin equality).
        """
        B, L, d = s.shape
        n_cls, k = self.cfg.n_cls, self.cfg.n_recent
        lengths = mask.sum(1)
        ar = torch.arange(k, device=s.device)
        recent_idx = ((lengths - k).clamp(min=0)[:, None] + ar[None, :]).clamp(max=L - 1)
        idx = torch.cat([torch.arange(n_cls, device=s.device).expand(B, n_cls), recent_idx], dim=1)
        picked = torch.gather(s, 1, idx.unsqueeze(-1).expand(B, n_cls + k, d))
        real = (ar[None, :] < lengths.clamp(max=k)[:, None]).to(s.dtype)
        return picked[:, :n_cls], picked[:, n_cls:] * real.unsqueeze(-1)

    def flops(self, ls: int) -> int:
        pma = self.pma.flops(self.cfg.n_pma, ls) if self.pma is not None else 0
        return self.compress.flops() + pma + self.gate_s.flops(self.n_s)


class SequenceArch(nn.Module):
    """S' = MHA(PFFN(X_sum, S)); norms and residuals are our flagged choices."""

    def __init__(self, d: int, cfg: InterFormerConfig) -> None:
        super().__init__()
        if cfg.seq_norm not in SEQ_NORMS:
            raise ValueError(f"interformer.seq_norm: {cfg.seq_norm!r} is not one of {', '.join(SEQ_NORMS)}")
        self.cfg, self.d = cfg, d
        self.pffn_gen = nn.Linear(cfg.n_cls * d, d * d) if cfg.use_pffn else None
        self.ln1 = nn.LayerNorm(d) if cfg.seq_norm != "none" else nn.Identity()
        self.ln2 = nn.LayerNorm(d) if cfg.seq_norm != "none" else nn.Identity()
        self.mha = MultiHeadAttention(d, cfg.num_heads, cfg.use_rope, cfg.rope_base)

    def pffn(self, x_sum: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """Every token of example b times its own d×d weight W_b = reshape(Linear(flatten(X_sum_b)))."""
        assert self.pffn_gen is not None
        w = self.pffn_gen(x_sum.flatten(1)).view(-1, self.d, self.d)
        return torch.bmm(s, w)

    def _sub(self, s: torch.Tensor, f, ln: nn.Module) -> torch.Tensor:  # noqa: ANN001
        pre = self.cfg.seq_norm == "pre"
        out = f(ln(s) if pre else s)
        out = s + out if self.cfg.seq_residual else out
        return ln(out) if self.cfg.seq_norm == "post" else out

    @fp32_under_cpu_autocast
    def forward(self, x_sum: torch.Tensor, s: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.pffn_gen is not None:
            s = self._sub(s, lambda h: self.pffn(x_sum, h), self.ln1)
        s = self._sub(s, lambda h: self.mha(h, h, mask), self.ln2)
        return zero_padding(s, mask)

    def flops(self, ls: int) -> int:
        d = self.d
        pffn = 2 * self.cfg.n_cls * d * d * d + 2 * ls * d * d if self.pffn_gen is not None else 0
        return pffn + self.mha.flops(ls, ls)


class InterFormerLayer(nn.Module):
    def __init__(
        self, n_x: int, d: int, n_fm: int, n_lin: int, wcfg: WukongConfig, cfg: InterFormerConfig
    ) -> None:
        super().__init__()
        self.cross = CrossArch(n_x, d, cfg)
        self.interaction = WukongLayer(n_x + self.cross.n_s, d, n_fm, n_lin, wcfg)
        self.cla = CrossLayerAttention(d, wcfg.cla_heads) if wcfg.cross_layer_attention else None
        self.sequence = SequenceArch(d, cfg)
        self.n_out = n_fm + n_lin

    def forward(
        self, x: torch.Tensor, s: torch.Tensor, mask: torch.Tensor, memory: list[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x_sum, s_sum = self.cross(x, s, mask)
        x_new = self.interaction(torch.cat([x, s_sum], dim=1))
        if self.cla is not None:
            x_new = self.cla(x_new, memory)
        return x_new, self.sequence(x_sum, s, mask)

    def flops(self, ls: int, mem: int) -> int:
        cla = self.cla.flops(self.n_out, mem) if self.cla is not None else 0
        return self.cross.flops(ls) + self.interaction.flops() + cla + self.sequence.flops(ls)


class InterFormer(nn.Module):
    """X [B, n, d] + sequence [B, L, d] + mask -> (head input [B, out_dim], X_sum, S_sum).

    out_dim = (2·n_cls + n_pma + n_recent)·d = flatten([X_sum ∥ S_sum]) of the final Cross Arch.
    """

    def __init__(self, n_x: int, d: int, wcfg: WukongConfig, cfg: InterFormerConfig) -> None:
        super().__init__()
        if cfg.num_layers < 1 or cfg.n_cls < 1:
            raise ValueError(f"interformer: need num_layers >= 1 and n_cls >= 1, "
                             f"got {cfg.num_layers}, {cfg.n_cls}")
        self.cfg, self.d, self.n_x = cfg, d, n_x
        self.prepend = TokenCompress(n_x, cfg.n_cls, d, cfg.gate)
        self.layers = nn.ModuleList()
        n = n_x
        for nf, nl in layer_token_counts(wcfg, cfg.num_layers):
            self.layers.append(InterFormerLayer(n, d, nf, nl, wcfg, cfg))
            n = nf + nl
        self.final = CrossArch(n, d, cfg)
        self.out_dim = (cfg.n_cls + self.final.n_s) * d

    def forward(
        self, x: torch.Tensor, seq: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        seq, mask = ensure_nonempty(zero_padding(seq, mask), mask)
        cls = self.prepend(x)
        s = torch.cat([cls, seq], dim=1)
        m = F.pad(mask, (self.cfg.n_cls, 0), value=True)  # the CLS keys are always real
        memory = [x]
        for layer in self.layers:
            x, s = layer(x, s, m, memory)
            memory.append(x)
        x_sum, s_sum = self.final(x, s, m)
        return torch.cat([x_sum, s_sum], dim=1).flatten(1), x_sum, s_sum

    def flops(self, seq_len: int) -> int:
        ls = self.cfg.n_cls + max(seq_len, 1)
        total, mem = self.prepend.flops(), self.n_x
        for layer in self.layers:
            total += layer.flops(ls, mem)
            mem += layer.n_out
        return total + self.final.flops(ls)
