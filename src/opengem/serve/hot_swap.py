"""Hot swap: serve each new version of a continuously training run without dropping a request.

``opengem train --online`` publishes ``RUN/versions/vNNNN/`` (a version is published once its
``manifest.json`` exists). :class:`VersionWatcher` polls that folder on a background thread; for each
version newer than the one served it loads a predictor (``Predictor.load`` of the version folder, on the
serving backend), runs a canary, and only then switches :class:`ModelHolder` to it. The switch is one
reference assignment under a lock: the batcher reads the holder once per batch, so a batch in flight
finishes on the old predictor and the next one starts on the new one; no request sees half a swap.

A version that fails to load (a corrupt or half-copied folder, a digest mismatch) or fails the canary is
refused: the reason is logged (logger ``opengem.serve``) and kept in :attr:`VersionWatcher.refused`, the
old version keeps serving, and the refused one is not retried until its manifest changes.

The canary scores fixed requests (the operator's ``--canary`` file, else the most recent requests this
server answered) and demands that every score be finite and in [0, 1], that the reply have the tasks of
the version being replaced, and, when the serving backend is not eager, that an eager load of the same
version agree within ``canary_atol``: an export or AOTI compile that went wrong is caught before it
serves anyone. With no canary requests at all (a server nobody has called yet) the swap waits: swapping
in a model that has never scored anything would be a blind switch.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opengem.serve.batcher import Scorer

log = logging.getLogger("opengem.serve")
# the layout opengem.train.online publishes (a test keeps these equal to its constants; importing them
# from there would load the whole training stack into a server that only reads two names)
VERSIONS = "versions"
MANIFEST = "manifest.json"
VERSION_DIR = re.compile(r"v(\d+)")

Loader = Callable[[Path, str], Scorer]


class ModelHolder:
    """The predictor being served; ``swap`` replaces it atomically."""

    def __init__(self, model: Scorer, version_number: int | None = None) -> None:
        self._lock = threading.Lock()
        self._model = model
        self.version_number = version_number  # the vNNNN it was loaded from, when it came from a run
        self.swaps = 0

    def current(self) -> Scorer:
        with self._lock:
            return self._model

    def swap(self, model: Scorer, version_number: int | None = None) -> Scorer:
        """Serve ``model`` from the next batch on; return the one it replaces."""
        with self._lock:
            old, self._model = self._model, model
            self.version_number = version_number
            self.swaps += 1
        return old


class RecentRequests:
    """The last few requests answered successfully: canary material when the operator gave none."""

    def __init__(self, keep: int = 4) -> None:
        self._items: deque[dict[str, Any]] = deque(maxlen=keep)
        self._lock = threading.Lock()

    def add(self, request: dict[str, Any]) -> None:
        with self._lock:
            self._items.append(request)

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._items)


class CanaryError(Exception):
    """A loaded version that must not serve: the one-line reason is logged and the version refused."""


def published_versions(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(number, folder) of every published version (its manifest exists), oldest first."""
    root = Path(run_dir) / VERSIONS
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        m = VERSION_DIR.fullmatch(d.name)
        if m and (d / MANIFEST).is_file():
            found.append((int(m.group(1)), d))
    return sorted(found)


def check_scores(reply: Any, n_candidates: int, tasks: list[str] | None) -> dict[str, list[float]]:
    """The scores of one reply, or CanaryError: the shape, the tasks, finite and in [0, 1]."""
    scores = reply.get("scores") if isinstance(reply, dict) else None
    if not isinstance(scores, dict) or not scores:
        raise CanaryError(f"reply has no 'scores' object: {str(reply)[:200]}")
    if tasks is not None and sorted(scores) != sorted(tasks):
        raise CanaryError(f"tasks changed: serving {sorted(tasks)}, new version scores {sorted(scores)}")
    for task, values in scores.items():
        if not isinstance(values, list) or len(values) != n_candidates:
            raise CanaryError(f"task {task!r}: expected {n_candidates} scores, got {str(values)[:100]}")
        bad = [v for v in values
               if not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= 1]
        if bad:
            raise CanaryError(f"task {task!r}: {len(bad)} score(s) not finite in [0, 1], e.g. {bad[0]!r}")
    return scores


def run_canary(candidate: Scorer, requests: list[dict[str, Any]], tasks: list[str] | None,
               reference: Scorer | None = None, atol: float = 1e-4) -> None:
    """Raise CanaryError unless ``candidate`` scores ``requests`` sanely (and as ``reference`` does)."""
    if not requests:
        raise CanaryError("no canary requests")
    try:
        got = candidate.score_many(requests)
        want = reference.score_many(requests) if reference is not None else None
    except Exception as e:  # noqa: BLE001 - whatever the new version does wrong, it is refused for it
        raise CanaryError(f"scoring the canary requests failed: {type(e).__name__}: {e}") from e
    if len(got) != len(requests):
        raise CanaryError(f"{len(got)} replies for {len(requests)} canary requests")
    for i, req in enumerate(requests):
        n = len(req.get("candidates", []))
        scores = check_scores(got[i], n, tasks)
        if want is None:
            continue
        ref = check_scores(want[i], n, tasks)
        for task, values in scores.items():
            diff = max(abs(a - b) for a, b in zip(values, ref[task], strict=True))
            if diff > atol:
                raise CanaryError(f"task {task!r}: loaded backend differs from eager by {diff:.3g} "
                                  f"(> {atol:g}) on canary request {i}")


@dataclass
class VersionWatcher:
    """Poll a run's versions/ and swap each new one in after it loads and passes the canary."""

    run_dir: Path
    holder: ModelHolder
    load: Loader
    backend: str = "auto"
    poll_s: float = 2.0
    canary_requests: list[dict[str, Any]] = field(default_factory=list)
    recent: RecentRequests | None = None
    canary_atol: float = 1e-4
    on_swap: Callable[[Scorer], None] | None = None
    on_refuse: Callable[[int, str], None] | None = None
    refused: dict[int, str] = field(default_factory=dict)
    _refused_stamp: dict[int, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="opengem-hot-swap", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:  # noqa: BLE001 - the watcher must outlive any one bad poll
                log.exception("hot swap: polling %s failed; will retry", self.run_dir)
            self._stop.wait(self.poll_s)

    def poll_once(self) -> bool:
        """Try the newest unrefused version newer than the one served; True when it was swapped in."""
        current = self.holder.version_number
        for number, path in reversed(published_versions(self.run_dir)):
            if current is not None and number <= current:
                return False
            stamp = _manifest_stamp(path)
            if self._refused_stamp.get(number) == stamp:
                continue  # refused before, and nothing changed since
            reason = self._try(number, path)
            if reason is None:
                return True
            if reason.startswith("waiting:"):
                return False
            self.refused[number] = reason
            self._refused_stamp[number] = stamp
            log.warning("hot swap: refused version v%04d (%s): %s; still serving %s", number, path, reason,
                        _version_label(self.holder))
            if self.on_refuse is not None:
                self.on_refuse(number, reason)
        return False

    def _try(self, number: int, path: Path) -> str | None:
        """None when swapped in; else why not (``waiting: ...`` when it may pass later)."""
        requests = self.canary_requests or (self.recent.snapshot() if self.recent is not None else [])
        if not requests:
            return "waiting: no canary requests yet (pass --canary FILE or send a request)"
        try:
            candidate = self.load(path, self.backend)
            reference = self.load(path, "eager") if self.backend != "eager" else None
        except Exception as e:  # noqa: BLE001 - any load failure refuses the version, the old keeps serving
            return f"load failed: {type(e).__name__}: {_one_line(e)}"
        try:
            run_canary(candidate, requests, list(getattr(self.holder.current(), "tasks", None) or []) or None,
                       reference, self.canary_atol)
        except CanaryError as e:
            return f"canary failed: {_one_line(e)}"
        old = self.holder.swap(candidate, number)
        log.info("hot swap: now serving v%04d (%s) in place of %s", number,
                 getattr(candidate, "version", "?"), getattr(old, "version", "?"))
        if self.on_swap is not None:
            self.on_swap(candidate)
        return None


def _manifest_stamp(path: Path) -> float:
    try:
        return (path / MANIFEST).stat().st_mtime
    except OSError:
        return -1.0


def _version_label(holder: ModelHolder) -> str:
    return str(getattr(holder.current(), "version", "?"))


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:500]

