import statistics
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
torch.manual_seed(0)


def flash(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def reduce_form(q, k, v, mask):
    s = (q.unsqueeze(-2) * k.unsqueeze(-3)).sum(-1) * (q.shape[-1] ** -0.5)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, -1)
    return (p.unsqueeze(-1) * v.unsqueeze(-3)).sum(-2)


def mm_form(q, k, v, mask):
    s = torch.matmul(q, k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(s, -1), v)


def bench(fn, q, k, v, mask, g, reps=40):
    ts = []
    for _ in range(reps):
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        t0 = time.perf_counter()
        o = fn(qq, kk, vv, mask)
        o.backward(g)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts[5:]) * 1e3, o, qq.grad, kk.grad, vv.grad


for (B, H, Lq, D), Lk, masked in [
    ((512, 2, 24, 8), 24, True),
    ((512, 2, 2, 8), 24, True),
    ((512, 2, 8, 8), 64, True),
    ((940, 2, 16, 8), 16, True),
    ((512, 1, 16, 16), 12, False),
]:
    q = torch.randn(B, H, Lq, D)
    k = torch.randn(B, H, Lk, D)
    v = torch.randn(B, H, Lk, D)
    g = torch.randn(B, H, Lq, D)
    mask = None
    if masked:
        lens = torch.randint(1, Lk + 1, (B,))
        mask = (torch.arange(Lk)[None, :] < lens[:, None])[:, None, None, :]
    for _round in range(2):
        r = [bench(f, q, k, v, mask, g) for f in (flash, mm_form, reduce_form)]
        print((B, H, Lq, D), Lk, " ".join(f"{t[0]:.2f}" for t in r), "ms (flash, mm, reduce)", flush=True)
