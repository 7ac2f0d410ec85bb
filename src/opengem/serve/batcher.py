"""Dynamic batching: requests from many concurrent clients are scored by one ``score_many`` call.

A model's forward pass has a fixed cost per call (Python dispatch, thread start-up of every op) that one
request of a few candidates cannot amortise; merging the requests that arrive within a few hundred
microseconds of each other into one forward pass raises requests/s under load at a bounded latency cost.

One worker thread owns the model: it blocks for a first request, then keeps taking requests until the
batch holds ``max_batch_candidates`` candidates or ``max_wait_us`` has passed since that first request,
then calls ``score_many`` once. The model therefore runs off the event loop (the server stays responsive
while it computes), and exactly one forward pass runs at a time (PyTorch already uses every core it was
given for one pass; two in parallel would only contend).

The predictor is taken from a :class:`~opengem.serve.hot_swap.ModelHolder` once per batch: a hot swap
between batches is atomic, and a batch in flight finishes on the predictor it started with.

Waiting pays only when another request is on its way: with ``arriving`` (the server's count of requests
received but not yet queued) the batch stops waiting as soon as the queue is empty and nothing is
arriving, so a lone client never pays ``max_wait_us`` (it did: 500 us on every request), while under
load the requests that queue up during one forward pass still merge into the next.

One bad request must not fail the others it was batched with: when ``score_many`` refuses a batch with
:class:`BadRequest`, each of its requests is scored alone so that only the culprit gets the error.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from opengem.errors import OpengemError
from opengem.serve.errors import BadRequest


class Scorer(Protocol):
    """What the batcher needs of a predictor (opengem.serve.Predictor is one)."""

    version: str

    def score_many(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]: ...


class ServerBusy(OpengemError, RuntimeError):
    """The request queue is full or the batcher is shutting down: the client should retry later (503)."""


@dataclass
class BatchStats:
    """Counters the metrics endpoint and the tests read: how many forward passes served how much."""

    batches: int = 0
    requests: int = 0
    candidates: int = 0
    isolated_retries: int = 0  # batches refused with BadRequest and re-scored request by request
    seconds: float = 0.0  # wall time in score_many
    cpu_seconds: float = 0.0  # the worker thread's CPU time in score_many (time.thread_time)


@dataclass
class Ticket:
    """One queued request: its future, and when it was queued, started and finished scoring
    (``time.perf_counter``; the server's per-stage latency metrics read them)."""

    request: dict[str, Any]
    candidates: int
    future: Future[dict[str, Any]]
    queued: float = 0.0
    started: float = 0.0
    finished: float = 0.0


_STOP = object()


class DynamicBatcher:
    """Queue requests, score them in merged batches on one worker thread.

    ``current_model`` returns the predictor to use for the next batch (a hot-swap holder's ``current``).
    ``on_batch(requests, candidates, seconds, cpu_seconds)`` is called after every forward pass (metrics):
    ``cpu_seconds`` is the worker thread's own CPU time (``time.thread_time``), so that a batch that took
    long because the thread waited for a core (other processes) tells itself apart from one that computed.
    """

    def __init__(self, current_model: Callable[[], Scorer], max_batch_candidates: int = 2048,
                 max_wait_us: int = 500, max_queue: int = 4096,
                 on_batch: Callable[[int, int, float, float], None] | None = None,
                 arriving: Callable[[], int] | None = None) -> None:
        if max_batch_candidates < 1:
            raise ValueError(f"max_batch_candidates must be >= 1, got {max_batch_candidates}")
        if max_wait_us < 0:
            raise ValueError(f"max_wait_us must be >= 0, got {max_wait_us}")
        self.current_model = current_model
        self.max_batch_candidates = max_batch_candidates
        self.max_wait_s = max_wait_us / 1e6
        self.on_batch = on_batch
        self.arriving = arriving
        self.stats = BatchStats()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_queue)
        self._closing = False
        self._carry: Ticket | None = None  # taken from the queue but did not fit the batch: starts the next
        self._thread = threading.Thread(target=self._work, name="opengem-batcher", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ client side
    def submit_nowait(self, request: dict[str, Any]) -> Future[dict[str, Any]]:
        """Queue one request; the future resolves to its reply or raises its error."""
        return self.enqueue(request).future

    def enqueue(self, request: dict[str, Any]) -> Ticket:
        """Queue one request; its ticket's future resolves to its reply or raises its error."""
        if self._closing:
            raise ServerBusy("server is shutting down; retry on another replica")
        cands = request.get("candidates")
        item = Ticket(request, len(cands) if hasattr(cands, "__len__") else 0, Future(), time.perf_counter())
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            raise ServerBusy(f"request queue full ({self._queue.maxsize} waiting); retry later") from None
        return item

    async def submit(self, request: dict[str, Any]) -> dict[str, Any]:
        """Queue one request and await its reply without blocking the event loop."""
        return await asyncio.wrap_future(self.submit_nowait(request))

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop taking requests, score every one already queued, then stop the worker (graceful drain)."""
        if not self._closing:
            self._closing = True
            self._queue.put(_STOP)
        self._thread.join(timeout)

    # ------------------------------------------------------------------ worker side
    def _work(self) -> None:
        while True:
            batch, stop = self._collect()
            if batch:
                self._run(batch)
            if stop:
                return

    def _collect(self) -> tuple[list[Ticket], bool]:
        """One batch: block for its first request, then take more until full or the wait is over."""
        first = self._carry if self._carry is not None else self._queue.get()
        self._carry = None
        if first is _STOP:
            return [], True
        batch, total = [first], first.candidates
        deadline = time.perf_counter() + self.max_wait_s
        while total < self.max_batch_candidates:
            remaining = deadline - time.perf_counter()
            if self.arriving is not None and self._queue.empty() and self.arriving() <= 0:
                break  # nobody else is on the way: waiting would only delay this batch
            try:
                item = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                return batch, True
            if total + item.candidates > self.max_batch_candidates:
                self._carry = item
                break
            batch.append(item)
            total += item.candidates
        return batch, False

    def _run(self, batch: list[Ticket]) -> None:
        model = self.current_model()  # once per batch: a swap never splits a batch
        t0, cpu0 = time.perf_counter(), time.thread_time()
        for it in batch:
            it.started = t0
        try:
            replies = model.score_many([it.request for it in batch])
            if len(replies) != len(batch):
                raise RuntimeError(f"score_many returned {len(replies)} replies for {len(batch)} requests")
        except BadRequest as e:
            if len(batch) == 1:
                batch[0].future.set_exception(e)
            else:
                self.stats.isolated_retries += 1
                self._run_alone(model, batch)
        except Exception as e:  # noqa: BLE001 - a model failure fails this batch, never the worker
            for it in batch:
                it.future.set_exception(e)
        else:
            done = time.perf_counter()
            for it, reply in zip(batch, replies, strict=True):
                it.finished = done
                it.future.set_result(reply)
        seconds, cpu_seconds = time.perf_counter() - t0, time.thread_time() - cpu0
        cands = sum(it.candidates for it in batch)
        self.stats.batches += 1
        self.stats.requests += len(batch)
        self.stats.candidates += cands
        self.stats.seconds += seconds
        self.stats.cpu_seconds += cpu_seconds
        if self.on_batch is not None:
            self.on_batch(len(batch), cands, seconds, cpu_seconds)

    @staticmethod
    def _run_alone(model: Scorer, batch: list[Ticket]) -> None:
        for it in batch:
            try:
                reply = model.score_many([it.request])[0]
                it.finished = time.perf_counter()
                it.future.set_result(reply)
            except Exception as e:  # noqa: BLE001 - BadRequest for the culprit, whatever else for a crash
                it.future.set_exception(e)
