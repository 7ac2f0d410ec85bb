"""SDPA (the reference's CPU flash kernel) vs baddbmm + softmax + bmm with a hand-written backward on
contiguous operands, at InterFormer's Sequence Arch shape in GEM-small ([512, 2, 32, 16], a key mask), fwd +
bwd; equality checked first. Two interleaved rounds, one thread, median of 20 calls each.

    .venv/bin/python attention_probe.py
"""
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
torch.manual_seed(0)
B, H, L, dh = 512, 2, 32, 16
lengths = torch.randint(0, L + 1, (B,))
mask = torch.arange(L)[None] < lengths[:, None]
mask = mask | ((torch.arange(L) == 0) & ~mask.any(-1, keepdim=True))  # an empty row attends to its first slot
bool_mask = mask[:, None, None, :]
bias = torch.zeros(B, 1, 1, L).masked_fill(~bool_mask, float("-inf"))


class BmmAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, add):  # noqa: ANN001, ANN205
        p = torch.softmax(torch.baddbmm(add, q, k.transpose(1, 2), alpha=q.shape[-1] ** -0.5), -1)
        ctx.save_for_backward(q, k, v, p)
        return torch.bmm(p, v)

    @staticmethod
    def backward(ctx, go):  # noqa: ANN001, ANN205
        q, k, v, p = ctx.saved_tensors
        go = go.contiguous()
        dv = torch.bmm(p.transpose(1, 2), go)
        dp = torch.bmm(go, v.transpose(1, 2))
        ds = (p * (dp - (dp * p).sum(-1, keepdim=True))).mul_(q.shape[-1] ** -0.5)
        return torch.bmm(ds, k), torch.bmm(ds.transpose(1, 2), q), dv, None


def sdpa(q, k, v, m):  # noqa: ANN001, ANN201
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m)


def bmm_path(q, k, v):  # noqa: ANN001, ANN201
    def heads(x):  # noqa: ANN001, ANN202
        return x.transpose(1, 2).reshape(B * H, L, dh)

    add = bias.expand(B, H, 1, L).reshape(B * H, 1, L)
    return BmmAttention.apply(heads(q), heads(k), heads(v), add).view(B, H, L, dh)


q, k, v = (torch.randn(B, L, H, dh, requires_grad=True) for _ in range(3))
o1, o2 = sdpa(q, k, v, bool_mask), bmm_path(q, k, v)
g = torch.randn_like(o1)
g1, g2 = torch.autograd.grad(o1, (q, k, v), g), torch.autograd.grad(o2, (q, k, v), g)
print("max |diff| out", (o1 - o2).abs().max().item(),
      "grads", max((a - b).abs().max().item() for a, b in zip(g1, g2)))


def median_ms(f, n: int = 20) -> float:  # noqa: ANN001
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        o = f()
        o.backward(torch.ones_like(o))
        ts.append(time.perf_counter() - t)
    return sorted(ts)[n // 2] * 1e3


cases = [("sdpa, bool key mask", lambda: sdpa(q, k, v, bool_mask)),
         ("sdpa, additive mask", lambda: sdpa(q, k, v, bias)),
         ("sdpa, no mask", lambda: sdpa(q, k, v, None)),
         ("baddbmm + softmax + bmm", lambda: bmm_path(q, k, v))]
for name, f in cases * 2:
    print(f"{name:26s} {median_ms(f):6.2f} ms fwd + bwd")
