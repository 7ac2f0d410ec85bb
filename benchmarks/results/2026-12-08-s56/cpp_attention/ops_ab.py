"""The attention core alone at GEM-small's shapes: SDPA (the reference) vs the C++ kernel, forward and
forward + backward, one thread, interleaved repeats in one process (median ms), inputs as the model has
them (head-major views of token-major projections, jagged key masks with an empty and a full row).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/results/2026-12-08-s56/cpp_attention/ops_ab.py
"""
import os
import statistics
import time

import torch

from opengem.ops import attention

torch.set_num_threads(1)
# (B, H, Lq, Lk, D, calls per GEM-small step): the six calls of configs/small.toml's step, then a long one
SHAPES = [(512, 2, 8, 64, 8, 1), (950, 2, 16, 16, 8, 1), (512, 2, 2, 24, 8, 2), (512, 1, 16, 12, 16, 1),
          (512, 2, 24, 24, 8, 1), (512, 2, 64, 64, 8, 0)]
g = torch.Generator().manual_seed(0)


def inputs(B, H, Lq, Lk, D):
    q, k, v = (torch.randn(B, L, H, D, generator=g).transpose(1, 2).requires_grad_() for L in (Lq, Lk, Lk))
    n = torch.randint(0, Lk + 1, (B,), generator=g)
    n[0], n[1] = 0, Lk
    return q, k, v, torch.arange(Lk)[None] < n[:, None]


def timed(fn, reps):
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps * 1e3


print(f"{'B,H,Lq,Lk,D':>20s} {'sdpa fwd':>9s} {'cpp fwd':>8s} {'x':>5s} {'sdpa f+b':>9s} {'cpp f+b':>8s} "
      f"{'x':>5s}")
step = {"sdpa": 0.0, "cpp": 0.0}
for B, H, Lq, Lk, D, calls in SHAPES:
    q, k, v, m = inputs(B, H, Lq, Lk, D)
    gout = torch.randn(B, H, Lq, D, generator=g)

    def fwd(kernel, q=q, k=k, v=v, m=m):
        with torch.no_grad():
            attention.masked_attention(q, k, v, m, kernel=kernel)

    def fwd_bwd(kernel, q=q, k=k, v=v, m=m, gout=gout):
        o = attention.masked_attention(q, k, v, m, kernel=kernel)
        torch.autograd.grad(o, (q, k, v), gout)

    res = {(kind, kern): [] for kind in ("f", "fb") for kern in ("pytorch", "cpp")}
    for _ in range(7):
        for kern in ("pytorch", "cpp"):
            res[("f", kern)].append(timed(lambda kern=kern: fwd(kern), 5))
            res[("fb", kern)].append(timed(lambda kern=kern: fwd_bwd(kern), 5))
    med = {key: statistics.median(x) for key, x in res.items()}
    step["sdpa"] += calls * med[("fb", "pytorch")]
    step["cpp"] += calls * med[("fb", "cpp")]
    f_ref, f_cpp, fb_ref, fb_cpp = (med[("f", "pytorch")], med[("f", "cpp")], med[("fb", "pytorch")],
                                    med[("fb", "cpp")])
    print(f"{str((B, H, Lq, Lk, D)):>20s} {f_ref:9.2f} {f_cpp:8.2f} {f_ref / f_cpp:5.2f} {fb_ref:9.2f} "
          f"{fb_cpp:8.2f} {fb_ref / fb_cpp:5.2f}")
print(f"GEM-small's six calls, fwd + bwd: sdpa {step['sdpa']:.1f} ms, cpp {step['cpp']:.1f} ms "
      f"({step['sdpa'] / step['cpp']:.2f}x)")
print("load", os.getloadavg())
