"""Long-sequence encoder and the attention primitives every GEM block shares.

GEM's "pyramid-parallel" long-sequence module is unpublished beyond its name. ``kind="pyramid"`` is OUR
reconstruction: at each level three parallel branches read the (jagged, right-padded + mask) sequence

  (a) recent window   the last ``window`` real events, kept as they are;
  (b) target pooling  ``pool_tokens`` queries (the ranked ad's token + learned offsets) attend over all N
                      events: O(M·N), giving M tokens;
  (c) chunked local   events split into chunks of ``chunk`` (aligned to each row's oldest event), attention
                      inside each chunk, each chunk mean-pooled to one token;

and their outputs, ordered ``[chunks | pooled | recent]`` (coarse-and-old to fine-and-new), are compacted
(real tokens first, order kept) into a shorter sequence for the next level. Levels are planned from the
static ``max_len`` (never from a batch's padded length), so a row's output never depends on which rows it
is batched with. ``kind="full"`` is plain full self-attention over the whole sequence (the O(N²) baseline)
and ``kind="none"`` passes the last ``truncate`` events through.

Padding never leaks: padded positions are zeroed on entry and after every block, keys are masked, and a
row with no events attends to a single zeroed padding slot, so its output is a constant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import flop_counter

_aten = torch.ops.aten


def _register_cpu_sdpa_flops() -> None:
    """FlopCounterMode knows the CUDA SDPA kernels but not the CPU flash kernel: teach it the same formula."""
    op = getattr(_aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if op is None or op in flop_counter.flop_registry or op.default in flop_counter.flop_registry:
        return

    @flop_counter.register_flop_formula(op)
    def _cpu_flash_flop(query, key, value, *args, out_shape=None, **kwargs) -> int:  # noqa: ANN001
        return flop_counter.sdpa_flop_count(query, key, value)  # shapes (get_raw=False)


_register_cpu_sdpa_flops()


# --------------------------------------------------------------------------- jagged helpers


def safe_key_mask(mask: torch.Tensor) -> torch.Tensor:
    """Key mask where an empty row may attend to its first (zeroed) slot instead of producing NaN."""
    first = torch.arange(mask.shape[-1], device=mask.device) == 0  # functional: no in-place writes (FX)
    return mask | (first & ~mask.any(dim=-1, keepdim=True))


def zero_padding(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return values * mask.unsqueeze(-1).to(values.dtype)


def ensure_nonempty(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad a batch whose padded length is 0 to one (masked) slot, so attention always has a key."""
    if values.shape[1] > 0:
        return values, mask
    return F.pad(values, (0, 0, 0, 1)), F.pad(mask, (0, 1), value=False)


def gather_last(values: torch.Tensor, lengths: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exactly ``k`` slots: the last k real events of each right-padded row, oldest first, right-padded.

    Needs at least one padded slot (see ``ensure_nonempty``); slots past a short row are masked and zero.
    """
    B, L, d = values.shape
    ar = torch.arange(k, device=values.device)
    idx = ((lengths - k).clamp(min=0)[:, None] + ar[None, :]).clamp(max=L - 1)
    mask = ar[None, :] < lengths.clamp(max=k)[:, None]
    out = torch.gather(values, 1, idx.unsqueeze(-1).expand(B, k, d))
    return zero_padding(out, mask), mask


def compact(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Move each row's real tokens to the front, keeping their order (the right-padded convention)."""
    order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)
    values = torch.gather(values, 1, order.unsqueeze(-1).expand_as(values))
    mask = torch.gather(mask, 1, order)
    return zero_padding(values, mask), mask


# --------------------------------------------------------------------------- attention


def rope(x: torch.Tensor, pos: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding on the last dim (half-split form): <rope(q,m), rope(k,n)> depends on m-n."""
    dh = x.shape[-1]
    half = dh // 2
    freqs = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    ang = pos.to(torch.float32)[..., None] * freqs  # [..., L, half]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half : 2 * half]
    rotated = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return torch.cat([rotated, x[..., 2 * half :]], dim=-1) if dh % 2 else rotated


class MultiHeadAttention(nn.Module):
    """Multi-head attention with key-padding masks and optional RoPE, on SDPA (flash kernels, O(L) memory)."""

    def __init__(self, d: int, num_heads: int = 1, use_rope: bool = False, rope_base: float = 1e4) -> None:
        super().__init__()
        if d % num_heads:
            raise ValueError(f"attention: width d={d} is not divisible by num_heads={num_heads}")
        self.d, self.h, self.use_rope, self.rope_base = d, num_heads, use_rope, rope_base
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * d)
        self.out = nn.Linear(d, d)

    def forward(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        key_mask: torch.Tensor | None = None,
        q_pos: torch.Tensor | None = None,
        k_pos: torch.Tensor | None = None,
    ) -> torch.Tensor:
        B, Lq, d = query.shape
        Lk = keys.shape[1]
        dh = d // self.h
        q = self.q(query).view(B, Lq, self.h, dh).transpose(1, 2)
        k, v = self.kv(keys).view(B, Lk, 2, self.h, dh).permute(2, 0, 3, 1, 4)
        if self.use_rope:
            q = rope(q, torch.arange(Lq, device=q.device) if q_pos is None else q_pos, self.rope_base)
            k = rope(k, torch.arange(Lk, device=k.device) if k_pos is None else k_pos, self.rope_base)
        attn_mask = None if key_mask is None else safe_key_mask(key_mask)[:, None, None, :]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.out(o.transpose(1, 2).reshape(B, Lq, d))

    def flops(self, lq: int, lk: int) -> int:
        d = self.d
        return 2 * lq * d * d + 4 * lk * d * d + 2 * lq * d * d + 4 * lq * lk * d


class TransformerBlock(nn.Module):
    """Pre-LN self-attention + FFN block over a masked sequence (kind="full" and the chunked branch)."""

    def __init__(self, d: int, num_heads: int, ffn_mult: int, use_rope: bool) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = MultiHeadAttention(d, num_heads, use_rope)
        h = ffn_mult * d
        self.ffn = nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.Linear(h, d)) if ffn_mult else None
        self.d, self.ffn_mult = d, ffn_mult

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, mask)
        if self.ffn is not None:
            x = x + self.ffn(self.ln2(x))
        return zero_padding(x, mask)

    def flops(self, n: int) -> int:
        ffn = 4 * n * self.d * self.ffn_mult * self.d if self.ffn is not None else 0
        return self.attn.flops(n, n) + ffn


# --------------------------------------------------------------------------- encoder


@dataclass
class SequenceEncoderConfig:
    """Long-sequence encoder between the embeddings and the InterFormer layers (our reconstruction)."""

    kind: str = "pyramid"  # pyramid | full | none
    levels: int = 2  # pyramid: at most this many levels (a level that would not shrink it is dropped)
    window: int = 32  # pyramid (a): last W real events kept as they are
    pool_tokens: int = 8  # pyramid (b): M target-conditioned queries, O(M·N)
    chunk: int = 32  # pyramid (c): local-attention chunk size C (each chunk becomes one token)
    num_heads: int = 2  # heads of every attention in the encoder
    use_rope: bool = True  # RoPE inside chunked / full attention (positions from each row's oldest event)
    ffn_mult: int = 2  # FFN width multiple inside chunked / full attention blocks (0 = no FFN)
    full_layers: int = 1  # kind="full": number of full self-attention blocks
    truncate: int = 0  # kind="none": keep the last this many events (0 = all)


def _pyramid_plan(max_len: int, cfg: SequenceEncoderConfig) -> list[int]:
    """Input capacity of each level that shrinks the sequence, computed from the static max length."""
    plan, n = [], max_len
    for _ in range(cfg.levels):
        out = min(cfg.window, n) + cfg.pool_tokens + math.ceil(n / cfg.chunk)
        if out >= n:
            break
        plan.append(n)
        n = out
    return plan


class PyramidLevel(nn.Module):
    """One level: recent window ∥ target-keyed pooling ∥ chunked local attention, compacted."""

    def __init__(self, d: int, cfg: SequenceEncoderConfig) -> None:
        super().__init__()
        self.cfg, self.d = cfg, d
        self.offsets = nn.Parameter(torch.randn(cfg.pool_tokens, d) * 0.02)
        self.pool_ln = nn.LayerNorm(d)
        self.pool = MultiHeadAttention(d, cfg.num_heads)
        self.local = TransformerBlock(d, cfg.num_heads, cfg.ffn_mult, cfg.use_rope)
        self.branch = nn.Parameter(torch.zeros(3, d))  # which branch a token came from
        self.ln = nn.LayerNorm(d)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, target: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        B, N, d = x.shape
        lengths = mask.sum(1)
        recent, recent_mask = gather_last(x, lengths, min(cfg.window, N))
        queries = target[:, None, :] + self.offsets[None]
        pooled = self.pool(queries, self.pool_ln(x), mask)
        pooled_mask = (lengths > 0)[:, None].expand(B, cfg.pool_tokens)
        C = cfg.chunk
        nc = -(-N // C)
        xc = F.pad(x, (0, 0, 0, nc * C - N)).reshape(B * nc, C, d)
        mc = F.pad(mask, (0, nc * C - N), value=False).reshape(B * nc, C)
        local = self.local(xc, mc)
        cnt = mc.sum(1, keepdim=True).clamp(min=1).to(x.dtype)
        chunks = (local.sum(1) / cnt).reshape(B, nc, d)
        chunk_mask = mc.any(1).reshape(B, nc)
        out = torch.cat([chunks + self.branch[0], pooled + self.branch[1], recent + self.branch[2]], dim=1)
        out_mask = torch.cat([chunk_mask, pooled_mask, recent_mask], dim=1)
        return compact(self.ln(out), out_mask)

    def flops(self, n: int) -> int:
        cfg = self.cfg
        nc = -(-n // cfg.chunk)
        return self.pool.flops(cfg.pool_tokens, n) + nc * self.local.flops(cfg.chunk)

    def out_len(self, n: int) -> int:
        return min(self.cfg.window, n) + self.cfg.pool_tokens + -(-n // self.cfg.chunk)


class SequenceEncoder(nn.Module):
    """[B, L, d] + mask (+ target [B, d]) -> a shorter [B, L', d] + mask, right-padded, for InterFormer."""

    def __init__(self, d: int, max_len: int, cfg: SequenceEncoderConfig) -> None:
        super().__init__()
        if cfg.kind not in ("pyramid", "full", "none"):
            raise ValueError(f"sequence.kind: {cfg.kind!r} is not one of pyramid, full, none")
        for key in ("window", "pool_tokens", "chunk", "num_heads"):
            if getattr(cfg, key) < 1:
                raise ValueError(f"sequence.{key}: must be >= 1, got {getattr(cfg, key)}")
        self.cfg, self.d, self.max_len = cfg, d, max_len
        self.levels = nn.ModuleList(
            PyramidLevel(d, cfg) for _ in (_pyramid_plan(max_len, cfg) if cfg.kind == "pyramid" else [])
        )
        self.blocks = nn.ModuleList(
            TransformerBlock(d, cfg.num_heads, cfg.ffn_mult, cfg.use_rope)
            for _ in range(cfg.full_layers if cfg.kind == "full" else 0)
        )

    def forward(
        self, values: torch.Tensor, mask: torch.Tensor, target: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        values, mask = ensure_nonempty(zero_padding(values, mask), mask)
        if self.cfg.kind == "none":
            if self.cfg.truncate > 0:
                values, mask = gather_last(values, mask.sum(1), min(self.cfg.truncate, values.shape[1]))
            return values, mask
        if self.cfg.kind == "full":
            for blk in self.blocks:
                values = blk(values, mask)
            return values, mask
        if target is None:
            target = torch.zeros(values.shape[0], self.d, dtype=values.dtype, device=values.device)
        for level in self.levels:
            values, mask = level(values, mask, target)
        return values, mask

    def out_len(self, n: int) -> int:
        if self.cfg.kind == "none":
            return min(n, self.cfg.truncate) if self.cfg.truncate > 0 else n
        for level in self.levels:
            n = level.out_len(n)
        return n

    def flops(self, n: int) -> int:
        """Forward FLOPs per example at padded length n (every row full)."""
        total = 0
        for blk in self.blocks:
            total += blk.flops(n)
        for level in self.levels:
            total += level.flops(n)
            n = level.out_len(n)
        return total
