"""SDPA's CPU flash kernel against a plain attention (scale folded into q, an additive -inf key bias, softmax,
two matmuls), forward + backward, one thread, at GEM's attention shapes (session 35).

Two layouts: head-major contiguous q, k, v [B, H, L, dh] (what a micro-benchmark hands SDPA), and the model's:
q, k, v as transposed views of token-major projections [B, L, H * dh] with the output merged back, as
``opengem.model.sequence.MultiHeadAttention`` does.

    python attention_layouts.py
"""
import time

import torch
import torch.nn.functional as F

SHAPES = [(512, 2, 32, 32, 8), (512, 2, 8, 64, 8), (512, 2, 2, 32, 8), (935, 2, 16, 16, 8),
          (512, 1, 16, 12, 16), (512, 2, 32, 32, 16), (512, 2, 2, 32, 16), (512, 2, 8, 64, 16),
          (512, 2, 64, 64, 16)]


def bench(fn, n: int = 30) -> float:  # noqa: ANN001
    for _ in range(3):
        fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e3


def plain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    bias = torch.zeros(mask.shape, dtype=q.dtype).masked_fill_(~mask, float("-inf"))[:, None, None, :]
    s = torch.matmul(q * q.shape[-1] ** -0.5, k.transpose(-1, -2)) + bias
    return torch.matmul(s.softmax(-1), v)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])


def one_shape(B: int, H: int, Lq: int, Lk: int, dh: int) -> str:
    mask = torch.rand(B, Lk) > 0.3
    mask[:, 0] = True
    d = H * dh
    heads = [torch.randn(B, H, L, dh, requires_grad=True) for L in (Lq, Lk, Lk)]
    xq = torch.randn(B, Lq, d, requires_grad=True)
    xkv = torch.randn(B, Lk, 2 * d, requires_grad=True)
    g_heads, g_tokens = torch.randn(B, H, Lq, dh), torch.randn(B, Lq, d)

    def head_major(att) -> None:  # noqa: ANN001
        att(*heads, mask).backward(g_heads)

    def token_major(att) -> None:  # noqa: ANN001
        q = xq.view(B, Lq, H, dh).transpose(1, 2)
        k = xkv[..., :d].view(B, Lk, H, dh).transpose(1, 2)
        v = xkv[..., d:].view(B, Lk, H, dh).transpose(1, 2)
        att(q, k, v, mask).transpose(1, 2).reshape(B, Lq, d).backward(g_tokens)

    row = []
    for layout in (head_major, token_major):
        t = {name: min(bench(lambda a=att, f=layout: f(a)) for _ in range(2))
             for name, att in (("sdpa", sdpa), ("plain", plain))}
        row.append(f"{layout.__name__}: sdpa {t['sdpa']:6.2f} plain {t['plain']:6.2f} "
                   f"ratio {t['sdpa'] / t['plain']:.2f}")
    return " | ".join(row)


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    print("shape (B, H, Lq, Lk, dh): ms fwd+bwd, the faster of 2 rounds; ratio = SDPA / plain")
    for shape in SHAPES:
        print(shape, one_shape(*shape))


if __name__ == "__main__":
    main()
