import statistics
import time

import torch
import torch._inductor.config as ic
import torch.nn.functional as F

torch.set_num_threads(1)
torch.manual_seed(0)

W = torch.randn(16, 48) * 0.2
cos = torch.randn(24, 8)
sin = torch.randn(24, 8)


def heads(x):
    B, L, _ = x.shape
    q, k, v = (x @ W).view(B, L, 3, 2, 8).permute(2, 0, 3, 1, 4)
    rot = lambda t: t * cos + t.roll(4, dims=-1) * sin
    return rot(q), rot(k), v


def red(q, k, v):
    s = (q.unsqueeze(-2) * k.unsqueeze(-3)).sum(-1) * 8**-0.5
    return (torch.softmax(s, -1).unsqueeze(-1) * v.unsqueeze(-3)).sum(-2)


def f_flash(x):
    return F.scaled_dot_product_attention(*heads(x))


def f_red(x):
    return red(*heads(x))


def f_red_c(x):
    q, k, v = heads(x)
    return red(q.contiguous(), k.contiguous(), v.contiguous())


x = torch.randn(512, 24, 16)
for name, f in [("flash", f_flash), ("reduce", f_red), ("reduce+contig", f_red_c)]:
    c = torch.compile(f, dynamic=False, fullgraph=True)
    with torch.no_grad():
        c(x)
        ts = []
        for _ in range(40):
            t = time.perf_counter()
            c(x)
            ts.append(time.perf_counter() - t)
    print(name, f"{statistics.median(ts[5:]) * 1e3:.2f} ms", flush=True)
print([k for k in dir(ic) if "realize" in k])
for th in (1,):
    with ic.patch(realize_reads_threshold=th, realize_opcount_threshold=1):
        torch._dynamo.reset()
        c = torch.compile(f_red, dynamic=False, fullgraph=True)
        with torch.no_grad():
            c(x)
            ts = []
            for _ in range(40):
                t = time.perf_counter()
                c(x)
                ts.append(time.perf_counter() - t)
        print("reduce realize", th, f"{statistics.median(ts[5:]) * 1e3:.2f} ms", flush=True)
