"""The Triton twins against their references at GEM's shapes: largest |difference| (forward and every
gradient) and forward + backward milliseconds of each, in one process. Part 4 of ``gpu_check.sh``.

    python benchmarks/triton_kernels.py --json OUT.json              # CUDA: GEM-base shapes, bf16 and fp32
    TRITON_INTERPRET=1 python benchmarks/triton_kernels.py --tiny   # CPU: the script itself, tiny shapes

Jagged attention: rows of a GEM history (lengths drawn from 0..max_len, a tenth of them empty) as packed
events; the reference pads to max_len (what the model would do without the kernel). FMB: Wukong's FM
product + LayerNorm + MLP at the base recipe's FMB shape, the reference being the fused PyTorch twin.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch


def _time_ms(fn: Callable[[], Any], device: str, reps: int) -> float:
    for _ in range(2):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1e3


def _fwd_bwd(fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor], grad: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    out.backward(grad if grad is not None else _output_grad(out))
    return out.detach(), [x.grad for x in leaves]


def _output_grad(out: torch.Tensor) -> torch.Tensor:
    """The same upstream gradient for both twins, drawn once: drawing it on the CPU inside the timed loop
    cost more than the kernels (the first H200 run, session 24, timed ~400 ms of CPU randn per call)."""
    return torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(out)


def _compare(name: str, ref: Callable, tri: Callable, inputs: list[torch.Tensor], device: str, reps: int
             ) -> dict[str, Any]:
    grad = _output_grad(ref(*inputs).detach())
    (o_r, g_r), (o_t, g_t) = _fwd_bwd(ref, inputs, grad), _fwd_bwd(tri, inputs, grad)
    diff = max([(o_r.float() - o_t.float()).abs().max().item()] +
               [(a.float() - b.float()).abs().max().item() for a, b in zip(g_r, g_t)])
    scale = max([o_r.float().abs().max().item()] + [a.float().abs().max().item() for a in g_r])
    ms_r = _time_ms(lambda: _fwd_bwd(ref, inputs, grad), device, reps)
    ms_t = _time_ms(lambda: _fwd_bwd(tri, inputs, grad), device, reps)
    return {"op": name, "dtype": str(inputs[0].dtype).replace("torch.", ""), "max_abs_diff": diff,
            "max_abs_value": scale, "ref_ms": ms_r, "triton_ms": ms_t, "speedup": ms_r / ms_t}


def attention_case(rows: int, heads: int, dh: int, max_len: int, dtype: torch.dtype, device: str, reps: int
                   ) -> dict[str, Any]:
    from opengem.ops import attention

    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(0, max_len + 1, (rows,), generator=g)
    lengths[torch.rand(rows, generator=g) < 0.1] = 0
    n = int(lengths.sum())
    q, k, v = (torch.randn(n, heads, dh, generator=g).to(device, dtype) for _ in range(3))
    lt = lengths.to(device)
    res = _compare("jagged_attention", lambda a, b, c: attention.jagged_attention(a, b, c, lt, max_len),
                   lambda a, b, c: attention.jagged_attention(a, b, c, lt, max_len, kernel="triton"),
                   [q, k, v], device, reps)
    res["shape"] = f"{rows} rows, {n} events, H {heads}, dh {dh}, max_len {max_len}"
    return res


def fmb_case(batch: int, n: int, d: int, k: int, dims: list[int], dtype: torch.dtype, device: str, reps: int
             ) -> dict[str, Any]:
    from opengem.ops import fmb as fmb_ops

    g = torch.Generator().manual_seed(2)
    widths = [n * k, *dims]
    x = torch.randn(batch, n, d, generator=g)
    y = torch.randn(n, k, generator=g)
    ws = [torch.randn(o, i, generator=g) / i**0.5 for i, o in zip(widths[:-1], widths[1:])]
    bs = [torch.zeros(o) for o in widths[1:]]
    lw, lb = torch.ones(n * k), torch.zeros(n * k)
    inputs = [t.to(device, dtype) for t in (x, y, lw, lb, *ws, *bs)]
    L = len(ws)

    def call(kernel: str) -> Callable[..., torch.Tensor]:
        return lambda x, y, lw, lb, *wb: fmb_ops.fmb(x, y, lw, lb, list(wb[:L]), list(wb[L:]), kernel=kernel)

    res = _compare("fmb", call("fused"), call("triton"), inputs, device, reps)
    res["shape"] = f"batch {batch}, n {n}, d {d}, k {k}, MLP {dims}"
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here as JSON")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU, TRITON_INTERPRET=1)")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("triton_kernels: no CUDA GPU; on CPU run it with TRITON_INTERPRET=1 --tiny", file=sys.stderr)
        return 2
    results = []
    if args.tiny:
        cases = [(attention_case, (6, 2, 8, 20)), (fmb_case, (4, 8, 8, 4, [16, 8]))]
        dtypes, reps = [torch.float32], 1
    else:  # GEM-base (configs/base.toml): histories of <= 512 events, 4 heads of 32; its FMB: 64 tokens of
        # d 128, rank 16, MLP [1024] -> nF x d = 4096
        cases = [(attention_case, (2048, 4, 32, 512)), (fmb_case, (4096, 64, 128, 16, [1024, 4096]))]
        dtypes, reps = [torch.float32, torch.bfloat16], args.reps
    for dtype in dtypes:
        for fn, shape in cases:
            r = fn(*shape, dtype, device, reps)
            r["device"] = torch.cuda.get_device_name(0) if device == "cuda" else "cpu (Triton interpreter)"
            results.append(r)
            print(f"{r['op']:<17}{r['dtype']:>9}  max|diff| {r['max_abs_diff']:.2e} "
                  f"(of {r['max_abs_value']:.2e})  ref {r['ref_ms']:8.2f} ms  "
                  f"triton {r['triton_ms']:8.2f} ms  x{r['speedup']:.2f}  {r['shape']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
