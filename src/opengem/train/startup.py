"""StartupTimer: where the time between launching ``opengem train`` and the first useful step goes.

GEM reports a 5x faster job start-up; to improve start-up one must first see it. Phases are named and
timed by whoever runs them (the trainer: model build, sharding plan, data reader, checkpoint load, first
step; the compile helper: compile), and the breakdown ends up in train_summary.json and on the console.

"process_start" is the time from interpreter start to the trainer's first line: the CLI sets
``OPENGEM_T0`` (wall-clock seconds) as early as it can; failing that, the process start time is read from
/proc/self/stat (Linux), so the cost of importing torch/torchrec is visible too. Only the first timer of
a process counts it: a later run in the same process (the demo's second model, a test session) did not
wait for the interpreter to start, and counting from process start would charge it with every earlier
run's training. Phases and wall time are measured per run.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

T0_ENV = "OPENGEM_T0"
_process_start_claimed = False  # set by the first StartupTimer of the process


def process_start_time() -> float | None:
    """Wall-clock time this process started: $OPENGEM_T0, else /proc/self/stat, else None."""
    env = os.environ.get(T0_ENV)
    if env:
        try:
            return float(env)
        except ValueError:
            pass
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 (starttime), counted after "pid (comm)"
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class StartupTimer:
    """Named, additive phases (seconds) plus the time of useful training, for the start-up breakdown."""

    def __init__(self) -> None:
        global _process_start_claimed
        self.created = time.time()
        start = None if _process_start_claimed else process_start_time()
        _process_start_claimed = True
        self.phases: dict[str, float] = {}
        if start is not None and start > self.created:
            start = None  # a clock that went backwards, or a bad $OPENGEM_T0: do not invent a phase
        self.process_start = start  # None: this run's wall time starts when the timer is created
        if start is not None:
            self.phases["process_start"] = self.created - start

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a block; repeated names add up (e.g. compile of several blocks)."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t)

    def add(self, name: str, seconds: float) -> None:
        self.phases[name] = self.phases.get(name, 0.0) + float(seconds)

    def summary(self, train_seconds: float | None = None) -> dict[str, Any]:
        """Phases, total wall time so far, and the fraction of it spent training on new data.

        ``train_seconds``: time in training steps on new data (excluding the first step, already a
        phase, and steps replayed after a resume, which are not new data).
        """
        t_begin = self.process_start if self.process_start is not None else self.created
        wall = time.time() - t_begin
        out: dict[str, Any] = {"phases": {k: round(v, 4) for k, v in self.phases.items()},
                               "startup_seconds": round(sum(self.phases.values()), 4),
                               "wall_seconds": round(wall, 4)}
        if train_seconds is not None:
            out["train_seconds"] = round(train_seconds, 4)
            out["effective_training_fraction"] = round(train_seconds / wall, 4) if wall > 0 else None
        return out

    def format(self, train_seconds: float | None = None) -> str:
        s = self.summary(train_seconds)
        wall = s["wall_seconds"] or 1e-9
        lines = ["start-up breakdown:"]
        for k, v in s["phases"].items():
            lines.append(f"  {k:<18}{v:9.2f} s  {100 * v / wall:5.1f}%")
        if "train_seconds" in s:
            lines.append(f"  {'training':<18}{s['train_seconds']:9.2f} s  "
                         f"{100 * (s['effective_training_fraction'] or 0):5.1f}%  (effective training time)")
        lines.append(f"  {'wall':<18}{wall:9.2f} s")
        return "\n".join(lines)
