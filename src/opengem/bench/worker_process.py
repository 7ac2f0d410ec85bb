"""A study's run in a process of its own, forked from a server that has already imported the worker.

The iso-FLOP and ablation studies train each run in a fresh process (so that runs side by side share no
threads, caches or allocator state). Started as ``python -m worker`` every run first spent 5-9 s of one
core importing torch, TorchRec and opengem, a few hundred times in a study. Here the runs
are forked from one ``forkserver`` process per study that imported the worker modules once and ran nothing:
each run is still a process of its own that starts with no threads, tensors or caches of any other run, only
the imported modules. Off Linux the run starts as ``python -m worker`` as before.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import runpy
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from opengem.errors import TrainError

# what the server imports once: the study workers and what their runs import when they start (the workers
# import the trainer, the model registry and the data path lazily, so naming the workers alone saves nothing)
PRELOAD = ("torch", "torchrec", "pyarrow.parquet", "opengem.model.registry", "opengem.train.trainer",
           "opengem.train.evaluate", "opengem.train.data", "opengem.train.calibrate", "opengem.train.predict",
           "opengem.data.dataset", "opengem.data.sim_core", "opengem.bench.isoflop_worker",
           "opengem.bench.ablation_worker")

_lock = threading.Lock()
_context: Any = None


def _forkserver() -> Any:
    """The process's forkserver context with the worker modules preloaded (None where there is none)."""
    global _context
    with _lock:
        if _context is None:
            # Linux only: macOS offers a forkserver too, but forking a process that has loaded its system
            # frameworks (torch links Accelerate) is not safe there
            linux = sys.platform.startswith("linux")
            if not linux or "forkserver" not in multiprocessing.get_all_start_methods():
                _context = False
            else:
                _context = multiprocessing.get_context("forkserver")
                _context.set_forkserver_preload(list(PRELOAD))
        return _context or None


def _run_module(module: str, args: list[str], log_path: str) -> None:
    """In the forked child: stdout and stderr to the run's log, then ``python -m module args``."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def run_worker(module: str, args: list[str], log_path: Path) -> int:
    """Run ``python -m module args`` in a process of its own, its output in ``log_path``; its exit code."""
    ctx = _forkserver()
    if ctx is None:
        with open(log_path, "w") as fh:
            return subprocess.call([sys.executable, "-m", module, *args], stdout=fh, stderr=subprocess.STDOUT)
    proc = ctx.Process(target=_run_module, args=(module, list(args), str(log_path)))
    proc.start()
    proc.join()
    return int(proc.exitcode if proc.exitcode is not None else 1)


def train_in_worker_process(module: str, args: list[str], out: Path, run_dir: Path, study: str
                            ) -> dict[str, Any]:
    """Train one run with a study's worker module (``python -m module args``) in a process of its own, its
    output in OUT/logs/<run>.txt; returns RUN/result.json; TrainError naming the log when the run fails."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{run_dir.name}.txt"
    code = run_worker(module, args, log_path)
    if code != 0 or not (run_dir / "result.json").exists():
        tail = log_path.read_text().strip().splitlines()[-1:] if log_path.exists() else []
        raise TrainError(f"{study}: run {run_dir.name} failed (exit {code}): {(tail or ['(no output)'])[0]} "
                         f"(log: {log_path})")
    return json.loads((run_dir / "result.json").read_text())


def running_config(out: Path, name: str) -> Path:
    """Where a study's resolved config lives while it runs (its workers read it there):
    ``OUT/.<name>.running``. :func:`publish_config` makes it ``OUT/<name>`` once the results it describes
    are written, so a re-run stopped early leaves the config of the results beside it, not of a study that
    never finished."""
    return out / f".{name}.running"


def publish_config(out: Path, name: str) -> None:
    os.replace(running_config(out, name), out / name)
