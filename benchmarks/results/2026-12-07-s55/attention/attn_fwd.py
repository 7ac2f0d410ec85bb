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


cr = torch.compile(reduce_form, dynamic=False, fullgraph=True)
cm = torch.compile(mm_form, dynamic=False, fullgraph=True)
cf = torch.compile(flash, dynamic=False, fullgraph=True)


def bench(fn, *a, reps=40):
    ts = []
    with torch.no_grad():
        for _ in range(reps):
            t0 = time.perf_counter()
            o = fn(*a)
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts[5:]) * 1e3, o


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
    mask = None
    if masked:
        lens = torch.randint(1, Lk + 1, (B,))
        mask = (torch.arange(Lk)[None, :] < lens[:, None])[:, None, None, :]
    r = [bench(f, q, k, v, mask) for f in (cf, cm, cr)]
    print(
        (B, H, Lq, D),
        Lk,
        " ".join(f"{t:.2f}" for t, _ in r),
        "ms (flash, mm, reduce)",
        max((r[0][1] - x[1]).abs().max().item() for x in r),
        flush=True,
    )
