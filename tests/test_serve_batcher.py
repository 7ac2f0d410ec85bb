"""Dynamic batching: concurrent requests merge into one score_many call, within both limits, and one bad
request or a crashing model fails only the requests it concerns."""

from __future__ import annotations

import time

import pytest

from opengem.serve.batcher import DynamicBatcher, ServerBusy
from opengem.serve.errors import BadRequest
from serve_helpers import FakePredictor, request


def test_requests_queued_together_share_one_forward_pass() -> None:
    model = FakePredictor(delay_s=0.05)
    b = DynamicBatcher(lambda: model, max_batch_candidates=1000, max_wait_us=200_000)
    futures = [b.submit_nowait(request(3, start=10 * i)) for i in range(8)]
    replies = [f.result(timeout=10) for f in futures]
    b.close()
    assert sum(model.calls) == 8
    assert len(model.calls) < 8, model.calls  # merged
    # each reply is its own request's, as scoring it alone gives
    for i, r in enumerate(replies):
        assert r == FakePredictor().score(request(3, start=10 * i))
    assert b.stats.requests == 8 and b.stats.candidates == 24


def test_batch_never_exceeds_max_batch_candidates() -> None:
    model = FakePredictor()
    seen: list[int] = []
    b = DynamicBatcher(lambda: model, max_batch_candidates=7, max_wait_us=100_000,
                       on_batch=lambda n, c, s, cpu: seen.append(c))
    futures = [b.submit_nowait(request(3, start=i)) for i in range(10)]
    for f in futures:
        f.result(timeout=10)
    b.close()
    assert sum(seen) == 30 and max(seen) <= 7 and len(seen) >= 5


def test_zero_wait_still_serves_every_request() -> None:
    model = FakePredictor()
    b = DynamicBatcher(lambda: model, max_batch_candidates=1, max_wait_us=0)
    futures = [b.submit_nowait(request(4, start=i)) for i in range(5)]  # each alone is over the limit
    assert [len(f.result(timeout=10)["scores"]["click"]) for f in futures] == [4] * 5
    b.close()


def test_one_bad_request_does_not_fail_its_batch() -> None:
    model = FakePredictor(delay_s=0.02)
    b = DynamicBatcher(lambda: model, max_batch_candidates=1000, max_wait_us=200_000)
    bad = request(2)
    bad["candidates"][1]["colour"] = 3
    futures = [b.submit_nowait(request(2)), b.submit_nowait(bad), b.submit_nowait(request(2, start=5))]
    assert futures[0].result(timeout=10)["scores"]["click"]
    with pytest.raises(BadRequest, match="unknown feature 'colour'"):
        futures[1].result(timeout=10)
    assert futures[2].result(timeout=10)["scores"]["click"]
    b.close()
    assert b.stats.isolated_retries >= 1


def test_model_crash_fails_its_batch_and_the_worker_goes_on() -> None:
    class Crashing(FakePredictor):
        def score_many(self, requests):  # type: ignore[no-untyped-def]
            if any(r.get("crash") for r in requests):
                raise RuntimeError("kernel exploded")
            return super().score_many(requests)

    model = Crashing()
    b = DynamicBatcher(lambda: model, max_wait_us=0)
    with pytest.raises(RuntimeError, match="kernel exploded"):
        b.submit_nowait({**request(1), "crash": True}).result(timeout=10)
    assert b.submit_nowait(request(1)).result(timeout=10)["version"] == "v0"
    b.close()


def test_close_drains_the_queue_then_refuses() -> None:
    model = FakePredictor(delay_s=0.05)
    b = DynamicBatcher(lambda: model, max_batch_candidates=3, max_wait_us=0)
    futures = [b.submit_nowait(request(3, start=i)) for i in range(4)]
    b.close()
    assert all(f.done() and f.exception() is None for f in futures)
    with pytest.raises(ServerBusy):
        b.submit_nowait(request(1))


def test_full_queue_is_busy_not_a_hang() -> None:
    model = FakePredictor(delay_s=0.2)
    b = DynamicBatcher(lambda: model, max_batch_candidates=1, max_wait_us=0, max_queue=2)
    with pytest.raises(ServerBusy, match="queue full"):
        for i in range(10):
            b.submit_nowait(request(1, start=i))
    b.close()


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="max_batch_candidates"):
        DynamicBatcher(lambda: FakePredictor(), max_batch_candidates=0)
    with pytest.raises(ValueError, match="max_wait_us"):
        DynamicBatcher(lambda: FakePredictor(), max_wait_us=-1)


class _Spinning(FakePredictor):
    """Computes for ``cpu_s`` of this thread's CPU time per call (a busy loop), then scores."""

    def __init__(self, cpu_s: float) -> None:
        super().__init__()
        self.cpu_s = cpu_s

    def score_many(self, requests):  # type: ignore[no-untyped-def]
        start = time.thread_time()
        while time.thread_time() - start < self.cpu_s:
            pass
        return super().score_many(requests)


def test_batch_cpu_time_tells_computing_from_waiting() -> None:
    """A model that sleeps (waits, as a thread preempted by other processes does) takes wall time but no
    CPU; one that computes takes both: the per-batch CPU time is the model thread's own."""
    seen: list[tuple[float, float]] = []
    for model in (FakePredictor(delay_s=0.2), _Spinning(cpu_s=0.05)):
        b = DynamicBatcher(lambda m=model: m, max_wait_us=0,
                           on_batch=lambda n, c, s, cpu: seen.append((s, cpu)))
        b.submit_nowait(request(2)).result(timeout=30)
        b.close()
        assert (b.stats.seconds, b.stats.cpu_seconds) == seen[-1]
    (sleep_wall, sleep_cpu), (spin_wall, spin_cpu) = seen
    assert sleep_wall >= 0.2 and sleep_cpu < 0.05
    assert spin_cpu >= 0.05 and spin_wall >= spin_cpu
