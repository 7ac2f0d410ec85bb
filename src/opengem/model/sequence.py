"""Long-sequence encoder and the attention modules every GEM block shares (their math: ``opengem.ops``).

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

from opengem.ops.attention import (
    cpp_attention_supports,
    masked_attention,
    pooled_attention,
    rope,
    rope_positions,
    rope_tables,
    rotate,
)
from opengem.ops.cpu_autocast import fp32_under_cpu_autocast
from opengem.ops.jagged import compact, ensure_nonempty, gather_last, zero_padding
from opengem.ops.kernel import (
    WITH_FUSED,
    WITH_FUSED_AND_TRITON,
    Kernel,
    exporting_for_inductor,
    preparing_for_inductor,
    resolve_kernel,
)
from opengem.ops.linear import kernel_for, linear


def use_kernel(module: nn.Module, kernel: Kernel | str) -> nn.Module:
    """Set the ops kernel of every block under ``module`` that has one (attributes named ``kernel``).

    Kernels never change parameters, so one model can run either path: GEM sets its config's kernel once
    after building, and the equality tests flip the same weights between the reference and the fused twin.
    ``"triton"`` goes to the blocks that list it in their ``kernels`` (class attribute; default
    ``WITH_FUSED``); every other block runs its fused twin.
    """
    k = resolve_kernel(kernel, WITH_FUSED_AND_TRITON)
    for m in module.modules():
        if hasattr(m, "kernel"):
            m.kernel = k if k in getattr(m, "kernels", WITH_FUSED) else Kernel.FUSED
    return module

# --------------------------------------------------------------------------- attention modules


class MultiHeadAttention(nn.Module):
    """Multi-head attention with key-padding masks and optional RoPE: projections here, the math in ops/.

    ``kernel`` (see :func:`use_kernel`): the reference splits heads with strided views and rotates them;
    the fused path rotates q and k in the projection's own contiguous [B, L, H, dh] layout (RoPE acts on
    the last dim, so the result is the same) and only then views them head-major, and runs the attention
    core in the C++ kernel wherever it takes the call (:func:`cpp_attention_supports`: eager, CPU, up to
    64 keys, built), else in SDPA.
    """

    def __init__(self, d: int, num_heads: int = 1, use_rope: bool = False, rope_base: float = 1e4) -> None:
        super().__init__()
        if d % num_heads:
            raise ValueError(f"attention: width d={d} is not divisible by num_heads={num_heads}")
        self.d, self.h, self.use_rope, self.rope_base = d, num_heads, use_rope, rope_base
        self.kernel = Kernel.PYTORCH
        self.linear_kernel = Kernel.PYTORCH  # the fused path's K/V products (opengem.ops.linear)
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * d)
        self.out = nn.Linear(d, d)

    def _heads(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        q_pos: torch.Tensor | None = None,
        k_pos: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Projected q [B, H, Lq, dh], k and v [B, H, Lk, dh], rotated when ``use_rope``."""
        B, Lq, d = query.shape
        Lk = keys.shape[1]
        dh = d // self.h
        if self.kernel is Kernel.FUSED:
            return self._heads_fused(query, keys, q_pos, k_pos)
        q = self.q(query).view(B, Lq, self.h, dh).transpose(1, 2)
        k, v = self.kv(keys).view(B, Lk, 2, self.h, dh).permute(2, 0, 3, 1, 4)
        if self.use_rope:
            q = self._rope_arange(q) if q_pos is None else rope(q, q_pos, self.rope_base)
            k = self._rope_arange(k) if k_pos is None else rope(k, k_pos, self.rope_base)
        return q, k, v

    def _rope_arange(self, x: torch.Tensor) -> torch.Tensor:
        """RoPE of head-major rows [B, H, L, dh] at positions 0..L-1. In a program traced for Inductor
        the cos/sin tables are buffers made in the warm-up forward before the trace (constants of the
        compiled program: traced from ``arange``, Inductor fused their computation into the rotation and
        evaluated pow, cos and sin again for every element rotated, ~30 % of GEM's AOTI forward);
        everywhere else the reference computes them."""
        L, dh = x.shape[-2:]
        name = f"_rope_tables_{L}x{dh}"
        if preparing_for_inductor() and not dh % 2 and not hasattr(self, name + "_cos"):
            for part, table in zip(("_cos", "_sin"), rope_tables(L, dh, self.rope_base, x.dtype, x.device),
                                   strict=True):
                self.register_buffer(name + part, table, persistent=False)
        if exporting_for_inductor() and hasattr(self, name + "_cos"):
            return rotate(x, getattr(self, name + "_cos"), getattr(self, name + "_sin"), kernel=Kernel.FUSED)
        return rope(x, torch.arange(L, device=x.device), self.rope_base)

    def _heads_fused(
        self, query: torch.Tensor, keys: torch.Tensor, q_pos: torch.Tensor | None, k_pos: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, Lq, d = query.shape
        Lk, H = keys.shape[1], self.h
        dh = d // H
        # K and V from the two halves of the kv weight (not the halves of its output: unbinding the output
        # costs a strided stack in backward); RoPE on the contiguous token-major projections
        wk, wv = self.kv.weight[:d], self.kv.weight[d:]
        bk, bv = self.kv.bias[:d], self.kv.bias[d:]
        q = self.q(query).view(B, Lq, H, dh)
        lk = kernel_for(self.linear_kernel, keys, wk)
        k = linear(keys, wk, bk, kernel=lk).view(B, Lk, H, dh)
        v = linear(keys, wv, bv, kernel=lk).view(B, Lk, H, dh)
        if self.use_rope:
            fused = Kernel.FUSED
            q, k = (rope_positions(t, self.rope_base, kernel=fused) if pos is None else
                    rope(t, _token_major_pos(pos, B, H, t.shape[1], t.device), self.rope_base, kernel=fused)
                    for t, pos in ((q, q_pos), (k, k_pos)))
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def _core(self, q: torch.Tensor, k: torch.Tensor) -> Kernel:
        """The attention core for this call: the C++ kernel on the fused path where it takes it, else SDPA."""
        return Kernel.CPP if self.kernel is Kernel.FUSED and cpp_attention_supports(q, k) else Kernel.PYTORCH

    def _merge(self, o: torch.Tensor) -> torch.Tensor:
        B, _, Lq, _ = o.shape
        return self.out(o.transpose(1, 2).reshape(B, Lq, self.d))

    def forward(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        key_mask: torch.Tensor | None = None,
        q_pos: torch.Tensor | None = None,
        k_pos: torch.Tensor | None = None,
    ) -> torch.Tensor:
        q, k, v = self._heads(query, keys, q_pos, k_pos)
        return self._merge(masked_attention(q, k, v, key_mask, kernel=self._core(q, k)))

    def flops(self, lq: int, lk: int) -> int:
        d = self.d
        return 2 * lq * d * d + 4 * lk * d * d + 2 * lq * d * d + 4 * lq * lk * d


def _token_major_pos(pos: torch.Tensor | None, B: int, H: int, L: int, device: torch.device) -> torch.Tensor:
    """Positions for a [B, L, H] layout from positions that broadcast against [B, H, L] (default 0..L-1)."""
    if pos is None:
        return torch.arange(L, device=device)[:, None]
    return torch.broadcast_to(pos, (B, H, L)).transpose(1, 2)


class PooledAttention(MultiHeadAttention):
    """M queries pool a masked sequence (target-keyed pooling, PMA): O(M·N), also says which tokens are real.

    Same parameters as :class:`MultiHeadAttention` (checkpoints load either way); ``forward`` returns the
    pooled tokens [B, M, d] and their mask [B, M] (False for a row with no real key).
    """

    def forward(  # type: ignore[override]
        self, queries: torch.Tensor, keys: torch.Tensor, key_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v = self._heads(queries, keys)
        o, valid = pooled_attention(q, k, v, key_mask, kernel=self._core(q, k))
        return self._merge(o), valid


class TransformerBlock(nn.Module):
    """Pre-LN self-attention + FFN block over a masked sequence (kind="full" and the chunked branch)."""

    def __init__(self, d: int, num_heads: int, ffn_mult: int, use_rope: bool) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        if not ffn_mult:
            # no FFN: ln2 is unused. Trainable, it got no gradient, hence no optimizer state, and a resumed
            # run's fresh optimizer (which DCP initialises for every trainable parameter) expected state the
            # checkpoint never had ("Missing key ... ln2.bias.exp_avg": the demo recipe could not resume).
            # Frozen rather than removed, so that the runs saved before keep their parameter fingerprint.
            self.ln2.requires_grad_(False)
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

SEQUENCE_KINDS = ("pyramid", "full", "none")  # SequenceEncoderConfig.kind


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
        self.pool = PooledAttention(d, cfg.num_heads)
        self.local = TransformerBlock(d, cfg.num_heads, cfg.ffn_mult, cfg.use_rope)
        self.branch = nn.Parameter(torch.zeros(3, d))  # which branch a token came from
        self.ln = nn.LayerNorm(d)
        self.kernel = Kernel.PYTORCH

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, target: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        B, N, d = x.shape
        lengths = mask.sum(1)
        recent, recent_mask = gather_last(x, lengths, min(cfg.window, N))
        queries = target[:, None, :] + self.offsets[None]
        pooled, pooled_mask = self.pool(queries, self.pool_ln(x), mask)
        C = cfg.chunk
        nc = -(-N // C)
        xc = F.pad(x, (0, 0, 0, nc * C - N)).reshape(B * nc, C, d)
        mc = F.pad(mask, (0, nc * C - N), value=False).reshape(B * nc, C)
        cnt = mc.sum(1, keepdim=True).clamp(min=1).to(x.dtype)
        chunk_mask = mc.any(1)
        chunks = (self._chunk_sums(xc, mc, chunk_mask) / cnt).reshape(B, nc, d)
        chunk_mask = chunk_mask.reshape(B, nc)
        out = torch.cat([chunks + self.branch[0], pooled + self.branch[1], recent + self.branch[2]], dim=1)
        out_mask = torch.cat([chunk_mask, pooled_mask, recent_mask], dim=1)
        return compact(self.ln(out), out_mask)

    def _chunk_sums(self, xc: torch.Tensor, mc: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """Sum of each chunk's tokens after local attention, [B·nc, d].

        A chunk with no real event sums to exactly 0 (its tokens are zeroed), so the fused path runs the
        block on the real chunks only (jagged: about len/C of them per row instead of max_len/C) and
        scatters their sums into zeros; the reference runs every chunk. Under torch.compile the static
        form runs (selecting real chunks has a data-dependent shape, which would break the graph).
        """
        if self.kernel is not Kernel.FUSED or torch.compiler.is_compiling():
            return self.local(xc, mc).sum(1)
        idx = real.nonzero().squeeze(1)
        sums = self.local(xc.index_select(0, idx), mc.index_select(0, idx)).sum(1)
        return xc.new_zeros(xc.shape[0], xc.shape[2]).index_copy(0, idx, sums)

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
        if cfg.kind not in SEQUENCE_KINDS:
            raise ValueError(f"sequence.kind: {cfg.kind!r} is not one of {', '.join(SEQUENCE_KINDS)}")
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

    @fp32_under_cpu_autocast
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
