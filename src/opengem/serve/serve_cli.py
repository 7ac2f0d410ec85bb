"""``opengem serve``: score HTTP requests with an exported model, or with a training run's newest version.

    opengem serve --model DIR|RUN [--port 8000] [--host 127.0.0.1] [--backend auto|eager|export|aoti]
                  [--max-candidates 1024] [--max-batch-candidates 8192] [--max-wait-us 500]
                  [--config serve.toml] [--canary requests.json] [--poll-s 2] [--no-hot-swap]
                  [--cpus LIST] [--no-gc-freeze] [--http auto|httptools|h11] [--loop auto|uvloop|asyncio]
                  [--aoti-chunk-rows 0]

``--model`` is an export folder (``opengem export``) or a run folder. A run folder that has published
versions (``opengem train --online`` writes ``RUN/versions/vNNNN``) is served from its newest version
that loads, and hot-swapped to each newer one as it appears (see ``hot_swap.py``); ``--no-hot-swap``
serves the newest and stops looking. Every setting can also come from a TOML file of
:class:`~opengem.serve.server.ServeConfig` keys; a flag wins over the file.

SIGTERM drains (stops accepting, finishes the requests in flight) and exits 0. SIGTERM before the server
listens (while it loads, or exports and AOTI-compiles a run's version: minutes) stops it there, cleanly:
the compiler is stopped, the scratch folder removed, exit 143 (SIGINT: 130).
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from opengem.config import load_config
from opengem.errors import UsageError
from opengem.serve.artifact import is_artifact, refuse_damaged
from opengem.serve.batcher import Scorer
from opengem.serve.export import export_run
from opengem.serve.hot_swap import VERSION_DIR, VERSIONS
from opengem.serve.predictor import AOTI_CHUNK_ROWS, Predictor
from opengem.serve.runtime import StopRequested, freeze_heap, parse_cpus, pin_process, stop_on_signals
from opengem.serve.server import (
    EVENT_LOOPS,
    HTTP_PARSERS,
    ServeConfig,
    ServeConfigError,
    build_server,
    http_stack,
)

BACKENDS = ("auto", "eager", "export", "aoti")
# flag -> ServeConfig field, for the settings that are both
FLAGS = {"host": str, "port": int, "backend": str, "max_candidates": int, "max_batch_candidates": int,
         "max_wait_us": int, "aoti_chunk_rows": int, "max_queue": int, "poll_s": float, "cpus": str,
         "gc_freeze": bool, "http": str, "loop": str}
log = logging.getLogger("opengem.serve")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, metavar="DIR|RUN",
                   help="export folder, or run folder (one with versions/ is hot-swapped)")
    p.add_argument("--config", default=None, help="TOML file of serve settings (flags win)")
    p.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (default 8000; 0 = any free port)")
    p.add_argument("--backend", default=None, choices=BACKENDS, help="model backend (default auto)")
    p.add_argument("--max-candidates", type=int, default=None, help="per request (default 1024)")
    p.add_argument("--max-batch-candidates", type=int, default=None,
                   help="per forward pass, over merged requests (default 8192)")
    p.add_argument("--max-wait-us", type=int, default=None,
                   help="how long a batch waits for more requests, in microseconds (default 500)")
    p.add_argument("--aoti-chunk-rows", type=int, default=None,
                   help="the AOTI backend scores a larger merged batch in slices of this many rows (default "
                        "0 = one call); a small model's compiled forward can cost less per row on slices "
                        "that fit the CPU's cache (docs/SERVING.md)")
    p.add_argument("--max-queue", type=int, default=None, help="requests waiting; more get 503 (default "
                   "4096)")
    p.add_argument("--poll-s", type=float, default=None, help="hot swap: seconds between looks at versions/")
    p.add_argument("--canary", default=None, metavar="FILE.json",
                   help="hot swap: JSON list of requests every new version must score sanely (default: the "
                        "last requests served)")
    p.add_argument("--no-hot-swap", action="store_true", help="serve a run's newest version and stop looking")
    p.add_argument("--cpus", default=None, metavar="LIST",
                   help="pin the server to these CPUs, e.g. 0 or 0,2 or 1-3 (os.sched_setaffinity; torch "
                        "threads = their number unless OMP_NUM_THREADS is set)")
    p.add_argument("--http", default=None, choices=("auto", *HTTP_PARSERS),
                   help="uvicorn's HTTP parser (default auto: httptools when installed, else h11)")
    p.add_argument("--loop", default=None, choices=("auto", *EVENT_LOOPS),
                   help="event loop (default auto: uvloop when installed, else asyncio)")
    p.add_argument("--no-gc-freeze", dest="gc_freeze", action="store_false", default=None,
                   help="do not freeze the heap after loading (on by default: without it a full garbage "
                        "collection of the loaded process stalls a request for ~250 ms every few dozen)")


def resolve_config(args: argparse.Namespace) -> ServeConfig:
    """The TOML file (if any), then the flags given, checked so that no bad value reaches uvicorn."""
    cfg = load_config(ServeConfig, args.config)
    for name in FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            setattr(cfg, name, value)
    check_config(cfg)
    return cfg


def check_config(cfg: ServeConfig) -> None:
    if not 0 <= cfg.port <= 65535:
        raise UsageError(f"--port: must be in 0..65535 (got {cfg.port})")
    if cfg.backend not in BACKENDS:
        raise UsageError(f"--backend: one of {', '.join(BACKENDS)} (got {cfg.backend!r})")
    for name in ("max_candidates", "max_batch_candidates", "max_queue", "max_body_bytes"):
        if getattr(cfg, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')}: must be >= 1 (got {getattr(cfg, name)})")
    if cfg.aoti_chunk_rows < 0:
        raise UsageError(f"--aoti-chunk-rows: must be >= 0 (got {cfg.aoti_chunk_rows})")
    if cfg.max_wait_us < 0:
        raise UsageError(f"--max-wait-us: must be >= 0 (got {cfg.max_wait_us})")
    if cfg.poll_s <= 0:
        raise UsageError(f"--poll-s: must be > 0 (got {cfg.poll_s})")
    if cfg.cpus:
        parse_cpus(cfg.cpus)
    try:
        http_stack(cfg.http, cfg.loop)
    except ServeConfigError as e:
        raise UsageError(str(e)) from None


class PredictorLoader:
    """``Predictor.load`` with the server's candidate limit, plus the AOTI compile a run folder needs.

    An AOTI package is native code compiled for this CPU, so a run's version (a training checkpoint) is
    exported with ``--backend aoti`` into a scratch folder of this server first (in the background, while
    the old version serves: about a minute for a small model on a busy 2-core machine), then loaded. The
    scratch folder is removed when the server exits."""

    def __init__(self, max_candidates: int, aoti_chunk_rows: int = AOTI_CHUNK_ROWS) -> None:
        self.max_candidates = max_candidates
        self.aoti_chunk_rows = aoti_chunk_rows
        self._scratch: Path | None = None

    def __call__(self, path: Path, backend: str) -> Scorer:
        if backend == "aoti" and not is_artifact(path):
            refuse_damaged(path)  # (a damaged export folder is not a run to compile)
            path = self._export_aoti(Path(path))
        return Predictor.load(path, backend=backend, max_candidates=self.max_candidates,
                              aoti_chunk_rows=self.aoti_chunk_rows)

    def _export_aoti(self, path: Path) -> Path:
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="opengem-serve-aoti-"))
            atexit.register(shutil.rmtree, self._scratch, True)
        spec = str(path)
        if path.parent.name == VERSIONS and VERSION_DIR.fullmatch(path.name):
            spec = f"{path.parent.parent}@{int(path.name[1:])}"
        out = self._scratch / f"{path.name}-{time.time_ns()}"
        log.info("serve: compiling %s with AOTInductor into %s", spec, out)
        export_run(spec, out, backend="aoti")
        return out


def read_canary(path: str | None) -> list[dict[str, Any]]:
    if path is None:
        return []
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise UsageError(f"--canary {path}: not JSON ({e})") from None
    requests = data if isinstance(data, list) else [data]
    if not requests or not all(isinstance(r, dict) and isinstance(r.get("candidates"), list)
                               for r in requests):
        raise UsageError(f"--canary {path}: must be a request object or a non-empty list of them")
    return requests


def run(args: argparse.Namespace) -> int:
    cfg = resolve_config(args)
    canary = read_canary(args.canary)
    model_path = Path(args.model)
    if not model_path.exists():
        raise UsageError(f"--model {model_path}: no such folder")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False  # a library that configured the root logger would print every line twice
    try:
        with stop_on_signals():
            if cfg.cpus:
                pin_process(parse_cpus(cfg.cpus))
            loader = PredictorLoader(cfg.max_candidates, cfg.aoti_chunk_rows)
            server = build_server(model_path, cfg, canary, loader, hot_swap=not args.no_hot_swap)
            if cfg.gc_freeze:
                freeze_heap()
    except StopRequested as e:
        log.warning("opengem serve: %s while loading %s: stopped before listening", e, model_path)
        return e.exit_code
    server.serve_forever()
    return 0
