"""``train.cpu_linear``: fp32 dense layers through oneDNN on CPUs where PyTorch's BLAS is the slower one.

PyTorch sends a CPU fp32 ``nn.Linear`` to MKL's sgemm, and MKL picks its kernels by CPU vendor: on an AMD
EPYC host (Zen 5, AVX-512) it ran 80-93 GFLOP/s where oneDNN's fp32 product on the same tensors ran
180-200 (one thread; ``opengem.ops.onednn``). ``apply_cpu_linear`` turns every plain ``nn.Linear`` of a
model into :class:`OneDNNLinear` in place (the same parameters, names and checkpoints: only the class
changes), whose forward calls ``opengem.ops.linear`` with ``kernel="onednn"`` when the call can take it
(fp32 CPU tensors, no autocast, not under torch.compile, a product of at least ``MIN_MACS``:
``ops.linear.kernel_for``) and ``F.linear`` otherwise. Modules that feed their MLP weights to an op
themselves (a Wukong layer's fused FMB, the fused attention's K/V products) carry a ``linear_kernel``
attribute, set here the same way.

``"auto"`` (the default) decides by measuring, once per process and thread count: oneDNN is used only
where it runs a training-sized product at least ``AUTO_MARGIN`` times as fast as PyTorch's default, so
an Intel host whose MKL is as fast keeps PyTorch's path (and its exact numerics), and a host where the
gap is 2x takes it. The choice is logged and returned in the run's parallelize info.

A training run decides once (:func:`run_cpu_linear`): rank 0 measures, every rank takes its choice, and the
choice is kept in ``RUN/cpu_linear.json`` for ``--resume``. Where the two libraries are close (AMD Zen 4:
oneDNN 0.96-1.34x BLAS against the 1.3 margin) the probe's answer varies from process to process, and
with it the numerics: without this a run's ranks, or a run and its resume, could train on different kernels.

The measurement is also kept per machine (:func:`machine_speedup`: the CPU's model name, the thread count
and the torch version, in ``cpu_linear.json`` of opengem's cache folder, ``$OPENGEM_CPU_LINEAR_CACHE`` to
move it): the first run on a machine measures, every later run and process takes that answer. Without it
two runs of one config on one machine could train on different kernels: session 24 found that this alone
made 32 of the 174 runs shared by two iso-FLOP studies of the same config differ, by up to 0.043
validation NE for one run (each of the two kernels, forced, reproduces one study's number exactly). Delete
the file to measure again; ``train.cpu_linear = pytorch | onednn`` decides without measuring.
"""

from __future__ import annotations

import fcntl
import functools
import json
import logging
import os
import platform
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from opengem.data.commit import atomic_write_text
from opengem.ops.kernel import Kernel
from opengem.ops.linear import kernel_for, linear
from opengem.ops.onednn import onednn_linear
from opengem.train import distributed
from opengem.train.config import CPU_LINEAR_CHOICES
from opengem.train.env import cache_dir

log = logging.getLogger(__name__)

AUTO_MARGIN = 1.3  # measured ratios: 2.1-2.3x on AMD Zen 5; the choice must not flip on noise
PROBE_SHAPE = (512, 1024, 1024)  # rows, in, out: a GEM-small / DCNv2 MLP layer at batch 512
RECORD = "cpu_linear.json"  # RUN/cpu_linear.json: the kernel ``auto`` chose for the run
KERNELS = tuple(c for c in CPU_LINEAR_CHOICES if c != "auto")  # what ``auto`` resolves to


class OneDNNLinear(nn.Linear):
    """An ``nn.Linear`` whose fp32 CPU products run through oneDNN (see the module doc)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, kernel=kernel_for(Kernel.ONEDNN, x, self.weight))


def _best_ms(fn: object, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        best = min(best, time.perf_counter() - t)
    return best * 1e3


@functools.lru_cache(maxsize=8)
def onednn_speedup(threads: int) -> float:
    """How many times faster oneDNN runs a fp32 linear of ``PROBE_SHAPE`` than ``F.linear`` here (best of
    interleaved calls, ~0.2 s); 0.0 where this torch has no oneDNN."""
    if not onednn_linear.available():
        return 0.0
    m, k, n = PROBE_SHAPE
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    with torch.no_grad():
        ref = functools.partial(F.linear, x, w)
        one = functools.partial(onednn_linear.linear, x, w)
        ref(), one()  # warm-up: oneDNN builds its kernel for the shape
        t_ref, t_one = [], []
        for _ in range(3):
            t_ref.append(_best_ms(ref, 3))
            t_one.append(_best_ms(one, 3))
    return min(t_ref) / max(min(t_one), 1e-9)


def machine_cache_path() -> Path:
    """Where the measured speedups of this machine are kept (see the module doc)."""
    if os.environ.get("OPENGEM_CPU_LINEAR_CACHE"):
        return Path(os.environ["OPENGEM_CPU_LINEAR_CACHE"])
    return cache_dir() / "cpu_linear.json"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _read_table(path: Path) -> dict[str, object]:
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return table if isinstance(table, dict) else {}


def _recorded(table: dict[str, object], key: str) -> float | None:
    entry = table.get(key)
    speedup = entry.get("speedup") if isinstance(entry, dict) else None
    return float(speedup) if isinstance(speedup, (int, float)) and speedup >= 0 else None


def machine_speedup(threads: int) -> tuple[float, str]:
    """(:func:`onednn_speedup`, where it came from): this machine's recorded answer for this CPU, thread
    count and torch, or a new measurement, recorded. Measuring holds a lock on the file, so processes that
    start together (a study's workers) take one answer, never each their own."""
    path = machine_cache_path()
    key = f"{_cpu_model()} | threads {threads} | torch {torch.__version__}"
    if (speedup := _recorded(_read_table(path), key)) is not None:
        return speedup, f"recorded for this machine in {path}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_name(path.name + ".lock"), "w")
    except OSError as e:  # a read-only home: measure, as before the cache
        log.warning("train.cpu_linear = auto: cannot keep the measurement in %s (%s)", path, e)
        return onednn_speedup(threads), "measured (not kept)"
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        table = _read_table(path)  # another process may have measured while this one waited
        if (speedup := _recorded(table, key)) is not None:
            return speedup, f"recorded for this machine in {path}"
        speedup = round(onednn_speedup(threads), 4)
        table[key] = {"speedup": speedup, "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        atomic_write_text(path, json.dumps(table, indent=1, sort_keys=True) + "\n")
    return speedup, f"measured, kept in {path}"


def resolve_cpu_linear(choice: str, device: torch.device) -> str:
    """``pytorch`` or ``onednn`` for this run (``auto`` measured, :func:`onednn_speedup`)."""
    if choice not in CPU_LINEAR_CHOICES:
        raise ValueError(f"train.cpu_linear: {choice!r} is not one of {', '.join(CPU_LINEAR_CHOICES)}")
    if device.type != "cpu" or choice == "pytorch":
        return "pytorch"
    if choice == "onednn":
        if not onednn_linear.available():
            raise RuntimeError("train.cpu_linear = 'onednn' needs a torch built with oneDNN (mkldnn)")
        return "onednn"
    speedup, source = machine_speedup(torch.get_num_threads())
    chosen = "onednn" if speedup >= AUTO_MARGIN else "pytorch"
    log.info("train.cpu_linear = auto: oneDNN runs a fp32 linear %.2fx as fast as PyTorch's BLAS here "
             "(%s): %s", speedup, source, chosen)
    return chosen


def recorded_kernel(run_dir: str | Path) -> str | None:
    """The kernel ``RUN/cpu_linear.json`` records, None when there is none, it is unreadable, or it names
    oneDNN and this torch has none (a run resumed on another build decides again)."""
    try:
        kernel = json.loads((Path(run_dir) / RECORD).read_text()).get("kernel")
    except (OSError, ValueError, AttributeError):
        return None
    if kernel not in KERNELS or (kernel == "onednn" and not onednn_linear.available()):
        return None
    return kernel


def run_cpu_linear(choice: str, device: torch.device, run_dir: str | Path | None, resume: bool) -> str:
    """The kernel of one training run: ``auto`` resolved once, by rank 0 (or taken from the run's record
    when ``resume``), the same on every rank, and recorded in ``RUN/cpu_linear.json`` by rank 0."""
    if choice != "auto" or device.type != "cpu":
        return resolve_cpu_linear(choice, device)
    main = distributed.is_main()
    kernel, how = KERNELS[0], "measured"  # the other ranks take rank 0's choice and measure nothing
    if main:
        recorded = recorded_kernel(run_dir) if resume and run_dir is not None else None
        if recorded is not None:
            kernel, how = recorded, "recorded by the run"
        else:
            kernel = resolve_cpu_linear("auto", device)
    if distributed.world_size() > 1:  # rank 0's choice, so that no two ranks run different numerics
        t = torch.tensor([KERNELS.index(kernel)], dtype=torch.int32)
        dist.broadcast(t, src=0)
        kernel = KERNELS[int(t.item())]
    if run_dir is not None and main:
        atomic_write_text(Path(run_dir) / RECORD, json.dumps({"kernel": kernel, "how": how}) + "\n")
    return kernel


def apply_cpu_linear(model: nn.Module, choice: str, device: torch.device) -> dict[str, object]:
    """When ``choice`` resolves to oneDNN: make the plain ``nn.Linear`` modules of ``model``
    :class:`OneDNNLinear`, and set ``linear_kernel`` on the modules that run their weights through an op
    themselves (a Wukong layer's fused FMB, the fused attention's K/V). Returns what was done
    (``{"kernel", "layers", "ops"}``)."""
    kernel = resolve_cpu_linear(choice, device)
    layers = ops = 0
    if kernel == "onednn":
        for m in model.modules():
            if type(m) is nn.Linear:
                m.__class__ = OneDNNLinear
                layers += 1
            if hasattr(m, "linear_kernel"):
                m.linear_kernel = Kernel.ONEDNN
                ops += 1
    return {"kernel": kernel, "layers": layers, "ops": ops}
