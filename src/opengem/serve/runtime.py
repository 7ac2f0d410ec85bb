"""Process settings of a latency-bound server: CPU pinning, and a garbage collector that never pauses long.

**The p99 tail was the garbage collector.** A server process holds ~375,000 long-lived Python objects
once torch, pyarrow, Starlette and a model are loaded, and every 512-candidate JSON request allocates
~10,000 more. the objects of a request still being handled when a young collection runs are promoted to the
oldest generation (they die soon after, by reference counting, but stay counted), and once those exceed
a quarter of the old objects CPython runs a *full* collection, which walks every object in the heap:
~240 ms of one core, measured in the server process, every few dozen requests: the ~250 ms p99 (p50
~20 ms) that ``opengem bench serve`` showed.
:func:`freeze_heap` collects once after loading and moves everything alive to the permanent generation
(``gc.freeze``, made for exactly this: long-lived servers), after which a full collection only walks
what requests allocate (~0.01 ms measured); a larger first-generation threshold makes the young
collections rarer as well.

**Pinning.** ``opengem serve --cpus 0`` (``os.sched_setaffinity``) keeps the server on the cores it was
given, so that a load generator or a batch job on the same machine cannot preempt it in the middle of a
request, and sets torch's intra-op threads to the number of those cores (unless ``OMP_NUM_THREADS`` says
otherwise): more threads than cores only adds hand-offs.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import time
from collections.abc import Callable, Iterator

from opengem.errors import UsageError

GEN0_THRESHOLD = 20_000  # CPython's default is 700: a 512-candidate JSON body alone allocates ~10,000


def parse_cpus(text: str) -> list[int]:
    """``"0"``, ``"0,2"``, ``"1-3"`` -> sorted CPU numbers; UsageError for anything else."""
    cpus: set[int] = set()
    try:
        for part in (p.strip() for p in text.split(",")):
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo > hi:
                    raise ValueError(part)
                cpus.update(range(lo, hi + 1))
            else:
                cpus.add(int(part))
    except ValueError:
        raise UsageError(f"--cpus: a list such as 0 or 0,2 or 1-3, got {text!r}") from None
    if not cpus or min(cpus) < 0:
        raise UsageError(f"--cpus: a list such as 0 or 0,2 or 1-3, got {text!r}")
    return sorted(cpus)


def available_cpus() -> list[int]:
    """The CPUs this process may run on."""
    return sorted(os.sched_getaffinity(0))


def pin_process(cpus: list[int]) -> None:
    """Run this process (every thread it has and will start) on ``cpus`` only, with as many torch
    threads as CPUs unless ``OMP_NUM_THREADS`` is set."""
    try:  # the kernel knows which CPUs this process may take (its cpuset), not the mask it inherited
        os.sched_setaffinity(0, cpus)
    except (OSError, ValueError) as e:
        raise UsageError(f"--cpus {','.join(map(str, cpus))}: cannot run on these CPUs ({e}; "
                         f"os.cpu_count() = {os.cpu_count()})") from None
    if not os.environ.get("OMP_NUM_THREADS"):
        import torch

        torch.set_num_threads(len(cpus))


def freeze_heap(gen0_threshold: int = GEN0_THRESHOLD) -> None:
    """Collect once, then exempt every object alive now from later collections (see the module doc)."""
    gc.collect()
    gc.freeze()
    _, g1, g2 = gc.get_threshold()
    gc.set_threshold(gen0_threshold, g1, g2)


class GcPauses:
    """Times every garbage collection of this process and hands (generation, seconds) to ``observe``:
    what the server's ``opengem_gc_pause_seconds`` histogram shows, so a tail it causes is visible."""

    def __init__(self, observe: Callable[[int, float], None]) -> None:
        self.observe = observe
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.observe(int(info.get("generation", -1)), time.perf_counter() - self._start)

    def close(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)


def split_cpus(cpus: list[int]) -> tuple[list[int], list[int]] | None:
    """(one CPU for a server, the others for its load generator), or None with fewer than two CPUs."""
    return ([cpus[0]], cpus[1:]) if len(cpus) >= 2 else None


class StopRequested(BaseException):
    """SIGTERM (or SIGINT) arrived while the server was still loading: unwind and exit.

    A BaseException, like KeyboardInterrupt, so that no ``except Exception`` on the way (the loader that
    tries the version before a broken one, a retry around a compile) can swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum  # the shell's convention: 143 for SIGTERM, 130 for SIGINT


@contextlib.contextmanager
def stop_on_signals(signums: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> Iterator[None]:
    """Turn these signals into :class:`StopRequested` in the main thread while the block runs.

    Why: before it listens, ``opengem serve`` may spend minutes exporting and AOTI-compiling a run's
    version. Killed there by the default SIGTERM action, the process skipped every cleanup: its scratch
    folder of compiled packages (removed ``atexit``) stayed behind, and the exit said nothing. Raised as
    an exception instead, the stop unwinds the stack: ``subprocess.run`` kills the compiler it was waiting
    for, ``atexit`` removes the scratch folder, and the command exits 143 with one line. Python runs the
    handler as soon as the main thread is back in the interpreter; a wait on a child process returns to
    it at once (EINTR), so the stop is prompt there."""

    def raise_stop(signum: int, frame: object) -> None:
        raise StopRequested(signum)

    previous = {s: signal.signal(s, raise_stop) for s in signums}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
