"""Attention core: SDPA flash vs torch.compile'd explicit attention at GEM-small-d32's shapes, fwd+bwd."""
import statistics
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
torch.manual_seed(0)
SHAPES = [((512, 2, 2, 16), 32, True, 3), ((512, 2, 32, 16), 32, True, 2), ((512, 2, 8, 16), 64, True, 1),
          ((512, 1, 16, 32), 8, False, 1), ((512, 1, 16, 32), 24, False, 1), ((930, 2, 16, 16), 16, True, 1)]


def explicit(q, k, v, mask):
    s = torch.matmul(q, k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(s, -1), v)


def flash(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


compiled = torch.compile(explicit, dynamic=False, fullgraph=True)
compiled_sdpa = torch.compile(flash, dynamic=False, fullgraph=True)


def bench(fn, q, k, v, mask, g, reps=20):
    ts = []
    for _ in range(reps):
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        t0 = time.process_time()
        o = fn(qq, kk, vv, mask)
        o.backward(g)
        ts.append(time.process_time() - t0)
    return statistics.median(ts[5:]) * 1e3, o, qq.grad


tot = {}
for shape, lk, masked, calls in SHAPES:
    B, H, Lq, dh = shape
    q = torch.randn(B, H, Lq, dh)
    k = torch.randn(B, H, lk, dh)
    v = torch.randn(B, H, lk, dh)
    mask = None
    if masked:
        lens = torch.randint(0, lk + 1, (B,))
        lens[0] = 0
        m = torch.arange(lk) < lens[:, None]
        m[:, 0] |= ~m.any(1)
        mask = m[:, None, None, :]
    g = torch.randn(B, H, Lq, dh)
    res = {n: bench(f, q, k, v, mask, g) for n, f in
           (("flash", flash), ("compiled", compiled), ("compiled_sdpa", compiled_sdpa))}
    for n, r in res.items():
        tot[n] = tot.get(n, 0.0) + r[0] * calls
    err = (res["compiled"][1] - res["flash"][1]).abs().max().item()
    print(shape, lk, "  ".join(f"{n} {r[0]:.2f}" for n, r in res.items()), f"x{calls} err {err:.1e}")
print("per step (weighted by calls):", {k: round(v, 1) for k, v in tot.items()})
