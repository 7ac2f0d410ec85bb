"""GEM's AOTInductor forward with masked attention on SDPA's CPU flash kernel (the reference, what packages
held before) vs written out as broadcast products reduced over the head width and the keys (ops/fused/fused_attention.masked_attention),
both compiled in this run from one artifact's model (RoPE tables as buffers in both); interleaved windows;
parity against eager; the eager forward for scale.

    .venv/bin/python benchmarks/results/2026-12-07-s55/attention/ab.py --model EXPORT --data DATA \
        [--candidates 512]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch
from torch._inductor.package import load_package

from opengem.bench.serve_bench import candidate_pool, make_request
from opengem.ops.kernel import Kernel
from opengem.serve import arrow_io
from opengem.serve.export import compile_aoti, export_program, flat_inputs
from opengem.serve.predictor import Predictor


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--candidates", type=int, default=512)
    ap.add_argument("--windows", type=int, default=7)
    ap.add_argument("--calls", type=int, default=6)
    a = ap.parse_args()
    torch.set_num_threads(1)
    p = Predictor.load(a.model, backend="eager")
    rows, surfaces, context = candidate_pool(a.data, None)
    body = make_request(rows, surfaces, context, a.candidates, 0, "arrow")
    req = arrow_io.decode_request(body, tables=True)
    b = p.encode([req])[0]
    x = flat_inputs(b, p.schema)
    tmp = Path(tempfile.mkdtemp())
    variants = {
        "SDPA flash (before)": mock.patch("opengem.model.sequence.inductor_kernel", create=True,
                                          return_value=Kernel.PYTORCH),
        "broadcast products (after)": contextlib.nullcontext(),
    }
    runners = {}
    for k, (name, patch) in enumerate(variants.items()):
        with patch:
            t = time.perf_counter()
            pkg = compile_aoti(export_program(p.model, p.schema, for_inductor=True), tmp / f"v{k}.pt2")
            print(f"{name}: export + AOTI compile {time.perf_counter() - t:.1f} s")
        runners[name] = load_package(str(pkg))
    model = p.model
    with torch.no_grad():
        ref = model(b).logits
        runners["eager (for scale)"] = lambda *args: model(b).logits
    for name, r in runners.items():
        print(f"{name}: max |out - eager| = {float((r(*x) - ref).detach().abs().max()):.2e}")
    times: dict[str, list[float]] = {k: [] for k in runners}
    with torch.no_grad():
        for _ in range(a.windows):
            for name, r in runners.items():
                r(*x)
                t = time.perf_counter()
                for _ in range(a.calls):
                    r(*x)
                times[name].append((time.perf_counter() - t) / a.calls * 1e3)
    for name, v in times.items():
        print(f"{a.candidates} candidates  {name:30s} ms per forward: median {statistics.median(v):.2f} "
              f"(min {min(v):.2f}, max {max(v):.2f}, {a.windows} windows)")
    print("load average", os.getloadavg())


if __name__ == "__main__":
    main()
