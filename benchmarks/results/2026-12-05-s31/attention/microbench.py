"""Attention core + its projections, forward and backward, one thread, process-CPU ms (min of 5 x 20 calls):
SDPA (the reference), the token-major twin (masked_attention_twin.py) and a per-head strided-bmm variant.

    .venv/bin/python benchmarks/results/2026-12-05-s31/attention/microbench.py
"""

from __future__ import annotations

import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import masked_attention_twin as twin  # noqa: E402

from opengem.ops.pytorch import pt_attention  # noqa: E402

D = 32
KINDS = ("sdpa", "twin", "perhead")


class PerHead(torch.autograd.Function):
    """Token-major q, k, v [B, L, H, dh]: per head, bmm on strided views (no layout copies), then stack."""

    @staticmethod
    def forward(ctx, q, k, v, bias):  # noqa: ANN001, ANN205
        scale = q.shape[-1] ** -0.5
        ps, outs = [], []
        for h in range(q.shape[2]):
            s = torch.bmm(q[:, :, h], k[:, :, h].transpose(1, 2)).mul_(scale)
            p = torch.softmax(s.add_(bias[:, None, :]), -1)
            ps.append(p)
            outs.append(torch.bmm(p, v[:, :, h]))
        ctx.save_for_backward(q, k, v, *ps)
        ctx.scale = scale
        return torch.stack(outs, 2)

    @staticmethod
    def backward(ctx, go):  # noqa: ANN001, ANN205
        q, k, v, *ps = ctx.saved_tensors
        dq, dk, dv = [], [], []
        for h, p in enumerate(ps):
            g = go[:, :, h]
            dv.append(torch.bmm(p.transpose(1, 2), g))
            ds = torch._softmax_backward_data(torch.bmm(g, v[:, :, h].transpose(1, 2)), p, -1, p.dtype)
            dq.append(torch.bmm(ds, k[:, :, h]).mul_(ctx.scale))
            dk.append(torch.bmm(ds.transpose(1, 2), q[:, :, h]).mul_(ctx.scale))
        return torch.stack(dq, 2), torch.stack(dk, 2), torch.stack(dv, 2), None


def setup(B: int, Lq: int, Lk: int, H: int) -> tuple:
    g = torch.Generator().manual_seed(0)
    xq = torch.randn(B, Lq, D, generator=g).requires_grad_()
    xk = torch.randn(B, Lk, D, generator=g).requires_grad_()
    ws = [(torch.randn(D, D, generator=g) / D**0.5).requires_grad_() for _ in range(3)]
    lens = torch.randint(0, Lk + 1, (B,), generator=g)
    lens[0] = 0
    return xq, xk, *ws, torch.arange(Lk)[None] < lens[:, None], H


def run(kind: str, xq, xk, wq, wk, wv, mask, H):  # noqa: ANN001, ANN201
    B, Lq, _ = xq.shape
    Lk, dh = xk.shape[1], D // H
    q, k, v = (xq @ wq).view(B, Lq, H, dh), (xk @ wk).view(B, Lk, H, dh), (xk @ wv).view(B, Lk, H, dh)
    if kind == "perhead":
        keep = pt_attention.safe_key_mask(mask)
        bias = torch.zeros(keep.shape).masked_fill_(~keep, float("-inf"))
        o = PerHead.apply(q, k, v, bias).reshape(B, Lq, D)
    else:
        core = pt_attention.masked_attention if kind == "sdpa" else twin.masked_attention
        o = core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask)
        o = o.transpose(1, 2).reshape(B, Lq, D)
    return o @ wq


def cpu_ms(kind: str, args: tuple, n: int = 20) -> float:
    go = torch.randn(args[0].shape[0], args[0].shape[1], D)
    for _ in range(3):
        run(kind, *args).backward(go)
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(n):
            run(kind, *args).backward(go)
        best = min(best, (time.process_time() - t0) / n * 1e3)
    return best


def main() -> None:
    torch.set_num_threads(1)
    for shape in [(512, 32, 32, 2), (512, 2, 32, 2), (512, 8, 64, 2), (930, 16, 16, 2), (512, 16, 24, 1)]:
        args = setup(*shape)
        outs = {}
        for kind in KINDS:
            for a in args[:5]:
                a.grad = None
            o = run(kind, *args)
            o.backward(torch.ones_like(o))
            outs[kind] = (o.detach(), args[0].grad.clone(), args[1].grad.clone())
        err = max((outs[kd][i] - outs["sdpa"][i]).abs().max().item() for kd in KINDS[1:] for i in range(3))
        times = "  ".join(f"{kind} {cpu_ms(kind, args):.2f}" for kind in KINDS)
        print(f"B, Lq, Lk, H = {shape}: {times} ms; max |diff| vs sdpa {err:.1e}")


if __name__ == "__main__":
    main()
