"""Sequence encoder cost: pyramid-parallel vs full self-attention at several sequence lengths.

Prints forward time (median of a few runs, no autograd unless --train), peak memory and analytic
GFLOP/example per (kind, length). Every configuration runs in a fresh subprocess. Peak memory: on CPU the
peak of live tensor bytes in the profiler's memory timeline over one step (inputs included); on CUDA
torch.cuda.max_memory_allocated over the timed steps, minus what was allocated before them.

    .venv/bin/python benchmarks/sequence_encoder.py                      # B=64, d=32, L = 100 1000 2000
    .venv/bin/python benchmarks/sequence_encoder.py --lengths 100 500 --train --device cuda
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

from opengem.model.sequence import SequenceEncoder, SequenceEncoderConfig


def measure(kind: str, L: int, B: int, d: int, repeats: int, train: bool, device: str, threads: int) -> dict:
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = SequenceEncoderConfig(kind=kind)  # defaults: pyramid 2 levels (W=32, M=8, C=32); full: 1 block
    enc = SequenceEncoder(d, L, cfg).to(device)
    lengths = torch.randint(L // 2, L + 1, (B,))
    lengths[0] = L
    x = torch.randn(B, L, d, device=device)
    mask = (torch.arange(L)[None, :] < lengths[:, None]).to(device)
    target = torch.randn(B, d, device=device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def step() -> None:
        with torch.set_grad_enabled(train):
            out, _ = enc(x.requires_grad_(train), mask, target)
            if train:
                out.sum().backward()
        sync()

    step()  # warm-up (allocator, kernels)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    cuda = device.startswith("cuda")
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else _cpu_peak_mb(step)
    return {"kind": kind, "L": L, "ms": 1000 * statistics.median(times), "peak_mb": peak,
            "gflop_per_example": enc.flops(L) / 1e9, "out_len": enc.out_len(L)}


def _cpu_peak_mb(step) -> float:  # noqa: ANN001
    """Peak bytes of live CPU tensors during one step, from the profiler's memory timeline."""
    acts = [ProfilerActivity.CPU]
    with profile(activities=acts, profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step()
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/timeline.json"
        prof.export_memory_timeline(path, device="cpu")
        with open(path) as f:
            _, sizes = json.load(f)
    return max(sum(s) for s in sizes) / 2**20


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[100, 1000, 2000])
    p.add_argument("--kinds", nargs="+", default=["pyramid", "full"])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--d", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--train", action="store_true", help="forward + backward instead of a no-grad forward")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--one", nargs=2, metavar=("KIND", "L"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        r = measure(args.one[0], int(args.one[1]), args.batch, args.d, args.repeats, args.train, args.device,
                    args.threads)
        print(json.dumps(r))
        return 0
    mode = "forward+backward" if args.train else "forward (no grad)"
    print(f"sequence encoder, {mode}, B={args.batch}, d={args.d}, device={args.device}, "
          f"threads={args.threads or torch.get_num_threads()}")
    print(f"{'kind':8} {'L':>6} {'out L':>6} {'ms':>10} {'peak MiB':>10} {'GFLOP/ex':>10}")
    rows = []
    for L in args.lengths:
        for kind in args.kinds:
            cmd = [sys.executable, __file__, "--one", kind, str(L), "--batch", str(args.batch),
                   "--d", str(args.d), "--repeats", str(args.repeats), "--device", args.device,
                   "--threads", str(args.threads)]
            if args.train:
                cmd.append("--train")
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            r = json.loads(res.stdout.splitlines()[-1])
            rows.append(r)
            print(f"{r['kind']:8} {r['L']:>6} {r['out_len']:>6} {r['ms']:>10.1f} {r['peak_mb']:>10.1f} "
                  f"{r['gflop_per_example']:>10.4f}", flush=True)
    for L in args.lengths:
        by = {r["kind"]: r for r in rows if r["L"] == L}
        if "pyramid" in by and "full" in by:
            print(f"L={L}: full / pyramid time {by['full']['ms'] / by['pyramid']['ms']:.1f}x, "
                  f"FLOPs {by['full']['gflop_per_example'] / by['pyramid']['gflop_per_example']:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
