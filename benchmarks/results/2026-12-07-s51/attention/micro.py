"""SDPA's CPU flash kernel vs explicit matmul attention at GEM-small-d32's shapes, fwd + bwd, 1 thread."""
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

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

def math_(q, k, v, mask):
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

def bench(fn, q, k, v, mask, reps=20):
    ts = []
    for _ in range(reps):
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        t0 = time.process_time()
        o = fn(qq, kk, vv, mask)
        o.backward(g)
        ts.append(time.process_time() - t0)
    return statistics.median(ts[3:]) * 1e3, o, qq.grad

tot = {"flash": 0.0, "explicit": 0.0, "math": 0.0}
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
    res = {}
    for name, fn in (("flash", flash), ("explicit", explicit), ("math", math_)):
        res[name] = bench(fn, q, k, v, mask)
        tot[name] += res[name][0] * calls
    err = ((res["explicit"][1] - res["flash"][1]).abs().max().item(),
           (res["explicit"][2] - res["flash"][2]).abs().max().item())
    print(shape, lk, f"flash {res['flash'][0]:.2f} ms  explicit {res['explicit'][0]:.2f}  "
          f"math {res['math'][0]:.2f}  x{calls}  err {err[0]:.1e}/{err[1]:.1e}")
print("per step (weighted by calls):", {k: round(v, 1) for k, v in tot.items()})
