"""The served vertical model's AOTInductor forward with DLRM's dot interaction as bmm + triangle gather
(the reference, what packages held before), as both vectors of each pair gathered by index and multiplied,
and as n - 1 broadcast slices (ops/fused/fused_dot_interaction), all compiled in this run from one
artifact's model; interleaved windows; parity against eager.

    .venv/bin/python benchmarks/results/2026-12-07-s53/dot_interaction/ab.py --model EXPORT --data VMDATA
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


def index_pairs(x: torch.Tensor) -> torch.Tensor:
    """The first fused form tried: both vectors of each pair gathered by index, multiplied, summed."""
    i, j = torch.triu_indices(x.shape[1], x.shape[1], offset=1)
    return (x[:, i] * x[:, j]).sum(-1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--windows", type=int, default=11)
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args()
    torch.set_num_threads(1)
    p = Predictor.load(a.model, backend="eager")
    rows, surfaces, context = candidate_pool(a.data, None)
    reqs = [arrow_io.decode_request(make_request(rows, surfaces, context, 512, i, "arrow"), tables=True)
            for i in range(16)]
    batches = {512: p.encode(reqs[:1])[0], 8192: p.encode(reqs)[0]}
    tmp = Path(tempfile.mkdtemp())
    runners = {}
    variants = {
        "bmm (reference)": mock.patch("opengem.model.baselines.inductor_kernel", return_value=Kernel.PYTORCH),
        "index pairs": mock.patch("opengem.ops.fused.fused_dot_interaction.dot_interaction", index_pairs),
        "slices (fused)": contextlib.nullcontext(),
    }
    for k, (name, patch) in enumerate(variants.items()):
        with patch:
            t = time.perf_counter()
            prog = export_program(p.model, p.schema, for_inductor=True)
            pkg = compile_aoti(prog, tmp / f"v{k}.pt2")
            print(f"{name}: export + AOTI compile {time.perf_counter() - t:.1f} s")
        runners[name] = load_package(str(pkg))
    for rows_n, b in batches.items():
        x = flat_inputs(b, p.schema)
        with torch.no_grad():
            ref = p.model(b).logits
        for name, r in runners.items():
            print(f"{rows_n} rows, {name}: max |AOTI - eager| = {float((r(*x) - ref).abs().max()):.2e}")
        times: dict[str, list[float]] = {k: [] for k in runners}
        for _ in range(a.windows):
            for name, r in runners.items():
                for _ in range(10):
                    r(*x)
                calls = a.calls if rows_n == 512 else a.calls // 8
                t = time.perf_counter()
                for _ in range(calls):
                    r(*x)
                times[name].append((time.perf_counter() - t) / calls * 1e3)
        for name, v in times.items():
            print(f"{rows_n:5d} rows  {name:16s} ms per forward: median {statistics.median(v):.3f} "
                  f"(min {min(v):.3f}, max {max(v):.3f}, {a.windows} windows)")
    print("load average", os.getloadavg())


if __name__ == "__main__":
    main()
