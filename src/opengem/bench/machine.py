"""What the machine can do and what a run costs it: matmul peak, peak memory, load average.

MFU is only meaningful against a peak measured in the same process, with the same thread count, at the
same moment (these machines are shared and noisy), so the benchmark measures its own peak: the median of
large square matmuls in the dtype the model's matmuls run in (under ``train.precision = "bf16"`` a
bf16 peak: AMX on CPU, about 7x the fp32 one), so a bf16 run is never flattered by the fp32 peak; timed in
wall time and in CPU time, after a warm-up, in blocks long enough to time (see :func:`matmul_peak`).
"""

from __future__ import annotations

import math
import os
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from opengem.ops.onednn import onednn_linear

CLEAR_REFS = Path("/proc/self/clear_refs")
STATUS = Path("/proc/self/status")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


PEAK_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # train.precision -> dtype of the peak
WARMUP_S = 0.25  # untimed matmuls first: oneDNN builds its AMX / AVX-512 kernels and the clock ramps up
MIN_BLOCK_S = 0.01  # each timed block runs enough matmuls to last this long: one bf16 1024^3 is ~2 ms


def matmul_peak(device: torch.device, n: int | None = None, repeats: int = 7,
                precision: str = "fp32") -> dict[str, float | int | str | list[float]]:
    """FLOP/s of n^3 matmuls (2 n^3 FLOPs each) in ``precision`` (fp32 | bf16): n = 1024 on CPU, 4096 on GPU.

    Why this shape of probe: a bf16 1024^3 matmul on AMX takes ~2 ms, so a probe of a few single calls
    right after start measured kernel creation, clock ramp-up and any time slice lost to other processes:
    it varied 3x between models in one bench run. Here: at least ``WARMUP_S`` of untimed matmuls of the
    same shape, then ``repeats`` timed blocks of ``inner`` matmuls (enough for ``MIN_BLOCK_S`` each).
    ``peak_flops`` is the best block (other work only ever slows a matmul down), ``peak_flops_median``
    the median block; both in wall time. ``peak_flops_cpu`` is the median block in this process's CPU
    time (``time.process_time``): a time slice lost to another process does not count there, so on a
    shared machine it is the steadier figure, and the bench divides CPU-time throughput by it
    (``mfu_cpu``). ``blocks_wall`` / ``blocks_cpu`` are every block's rate, for pooling across probes.
    fp32 on GPU is true fp32 unless the process enabled TF32 (``torch.backends.cuda.matmul``), as the
    model's own matmuls. fp32 on CPU times both PyTorch's ``a @ b`` (MKL's sgemm) and oneDNN's product
    (what ``train.cpu_linear = onednn`` runs) and keeps the faster (``peak_kernel``): on AMD hosts MKL runs
    at half of oneDNN's rate, and a peak from the slower one would put MFU above 100 %.
    """
    if precision not in PEAK_DTYPES:
        raise ValueError(f"matmul_peak: precision {precision!r} is not one of {', '.join(PEAK_DTYPES)}")
    if repeats < 1:
        raise ValueError(f"matmul_peak: repeats must be >= 1 (got {repeats})")
    dtype = PEAK_DTYPES[precision]
    n = n or (4096 if device.type == "cuda" else 1024)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    kernels: dict[str, Callable[[], object]] = {"aten": lambda: a @ b}
    if device.type == "cpu" and dtype == torch.float32 and onednn_linear.available():
        bt = b.t()  # a @ bt.T == a @ b: the product train.cpu_linear = onednn runs
        kernels["onednn"] = lambda: onednn_linear.linear(a, bt)
    fastest = {name: _fastest_call(fn, device) for name, fn in kernels.items()}
    kernel = min(fastest, key=fastest.__getitem__)
    fn, one = kernels[kernel], fastest[kernel]
    inner = max(1, min(64, math.ceil(MIN_BLOCK_S / max(one, 1e-9))))
    wall, cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        for _ in range(inner):
            fn()
        sync(device)
        flops = 2.0 * n**3 * inner
        wall.append(flops / max(time.perf_counter() - t, 1e-9))
        cpu.append(flops / max(time.process_time() - c, 1e-9))
    return {"peak_flops": max(wall), "peak_flops_median": statistics.median(wall),
            "peak_flops_cpu": statistics.median(cpu), "blocks_wall": wall, "blocks_cpu": cpu,
            "peak_n": n, "peak_inner": inner, "peak_dtype": str(dtype).removeprefix("torch."),
            "peak_threads": torch.get_num_threads() if device.type == "cpu" else 0, "peak_kernel": kernel}


def _fastest_call(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of the fastest of at least two warm calls over ``WARMUP_S`` (a lost time slice only adds)."""
    calls, one, t0 = 0, math.inf, time.perf_counter()
    while calls < 2 or time.perf_counter() - t0 < WARMUP_S:
        t = time.perf_counter()
        fn()
        sync(device)
        one = min(one, time.perf_counter() - t)
        calls += 1
    return one


def pool_peaks(probes: list[dict]) -> dict[str, float | int]:
    """One peak from several probes of the same shape and dtype (before, between and after timed windows).

    Best wall block over all probes (``peak_flops``), median of all wall blocks (``peak_flops_median``),
    median of all CPU-time blocks (``peak_flops_cpu``) and how many blocks that was (``peak_blocks``).
    """
    if not probes:
        raise ValueError("pool_peaks: no probes")
    wall = [r for p in probes for r in p["blocks_wall"]]
    cpu = [r for p in probes for r in p["blocks_cpu"]]
    return {"peak_flops": max(wall), "peak_flops_median": statistics.median(wall),
            "peak_flops_cpu": statistics.median(cpu), "peak_blocks": len(wall)}


def _status_kb(field: str) -> int | None:
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


class PeakMemory:
    """Peak memory of the code between ``start()`` and ``stop()``.

    GPU: ``torch.cuda.max_memory_allocated`` after a reset (tensors PyTorch allocated, not the caching
    allocator's reserve). CPU: peak resident set size (VmHWM) minus the RSS at start, after resetting
    the kernel's high-water mark through /proc/self/clear_refs, so earlier work in the process (data
    generation) does not hide in the peak; where that reset is unavailable, ru_maxrss minus the start
    RSS (an upper bound: it includes anything that peaked earlier). Includes model, optimizer state,
    activations and the batches held by the benchmark.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.method = ""
        self._base_kb = 0

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base_kb = torch.cuda.memory_allocated(self.device) // 1024
            self.method = "torch.cuda.max_memory_allocated - allocated at start"
            return
        try:
            CLEAR_REFS.write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
            self.method = "peak RSS (VmHWM after clear_refs reset) - RSS at start"
        except OSError:
            self.method = "ru_maxrss - RSS at start (upper bound: no clear_refs)"
        self._base_kb = _status_kb("VmRSS") or 0

    def stop(self) -> dict[str, float | str]:
        if self.device.type == "cuda":
            peak_kb = torch.cuda.max_memory_allocated(self.device) // 1024
        else:
            peak_kb = _status_kb("VmHWM") if "VmHWM" in self.method else None
            if peak_kb is None:
                peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {"peak_mem_mb": max(0, peak_kb - self._base_kb) / 1024, "peak_mem_abs_mb": peak_kb / 1024,
                "peak_mem_method": self.method}


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []
