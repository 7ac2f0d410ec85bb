"""Hot swap: new versions are loaded, canaried and switched in atomically; a corrupt version or one that
fails the canary is refused while the old one keeps serving; clients see zero failures across swaps."""

from __future__ import annotations

import ast
import importlib.util
import json
import threading
import time
from pathlib import Path

import pytest

from opengem.serve import hot_swap
from opengem.serve.batcher import DynamicBatcher
from opengem.serve.hot_swap import CanaryError, ModelHolder, RecentRequests, VersionWatcher, run_canary
from opengem.serve.server import ServeConfig, build_server
from serve_helpers import FakePredictor, fake_loader, get, post, publish_fake_version, request


def watcher_for(run: Path, canary: list | None = None) -> VersionWatcher:  # type: ignore[type-arg]
    holder = ModelHolder(fake_loader(run / "versions" / "v0001", "auto"), 1)
    return VersionWatcher(run, holder, fake_loader, backend="eager", poll_s=0.05,
                          canary_requests=[request(3)] if canary is None else canary)


def test_layout_constants_match_the_online_trainer() -> None:
    """Read from the trainer's sources, not imported: importing them loads torch (seconds on a busy CPU).
    The versions folder's name lives with the layout's reader (train/published.py), the manifest's with
    the online trainer."""
    consts = {}
    for module in ("opengem.train.published", "opengem.train.online"):
        source = Path(importlib.util.find_spec(module).origin).read_text()
        consts.update({t.id: n.value.value for n in ast.parse(source).body if isinstance(n, ast.Assign)
                       for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)})
    assert (hot_swap.VERSIONS, hot_swap.MANIFEST) == (consts["VERSIONS"], consts["MANIFEST"])


def test_new_version_is_swapped_in(tmp_path: Path) -> None:
    publish_fake_version(tmp_path, 1)
    w = watcher_for(tmp_path)
    assert not w.poll_once()  # nothing newer
    publish_fake_version(tmp_path, 2, bias=0.3)
    assert w.poll_once()
    assert w.holder.current().version == "v0002" and w.holder.version_number == 2 and w.holder.swaps == 1


def test_corrupt_version_is_refused_and_old_keeps_serving(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    publish_fake_version(tmp_path, 1)
    w = watcher_for(tmp_path)
    publish_fake_version(tmp_path, 2, corrupt=True)
    with caplog.at_level("WARNING", logger="opengem.serve"):
        assert not w.poll_once()
    assert w.holder.current().version == "v0001"
    assert "load failed: JSONDecodeError" in w.refused[2]
    assert "refused version v0002" in caplog.text
    assert not w.poll_once() and list(w.refused) == [2]  # not retried while unchanged
    publish_fake_version(tmp_path, 3)  # a good one after the bad one is taken
    assert w.poll_once() and w.holder.current().version == "v0003"


def test_newest_corrupt_falls_back_to_the_newest_good(tmp_path: Path) -> None:
    publish_fake_version(tmp_path, 1)
    w = watcher_for(tmp_path)
    publish_fake_version(tmp_path, 2)
    publish_fake_version(tmp_path, 3, corrupt=True)
    assert w.poll_once() and w.holder.version_number == 2 and 3 in w.refused


def test_canary_failure_is_refused(tmp_path: Path) -> None:
    publish_fake_version(tmp_path, 1)
    w = watcher_for(tmp_path)
    publish_fake_version(tmp_path, 2, nan=True)
    assert not w.poll_once()
    assert "canary failed" in w.refused[2] and "not finite in [0, 1]" in w.refused[2]
    assert w.holder.current().version == "v0001"


def test_canary_compares_against_eager(tmp_path: Path) -> None:
    """A non-eager backend must agree with an eager load of the same version."""
    publish_fake_version(tmp_path, 1)
    calls: list[str] = []

    def loader(path: Path, backend: str) -> FakePredictor:
        calls.append(backend)
        p = fake_loader(path, backend)
        if backend == "aoti":
            p.bias += 0.01  # a compile that changed the numbers
        return p

    holder = ModelHolder(fake_loader(tmp_path / "versions" / "v0001", "aoti"), 1)
    w = VersionWatcher(tmp_path, holder, loader, backend="aoti", canary_requests=[request(3)])
    publish_fake_version(tmp_path, 2)
    assert not w.poll_once()
    assert calls == ["aoti", "eager"] and "differs from eager" in w.refused[2]


def test_canary_checks_tasks_and_counts() -> None:
    with pytest.raises(CanaryError, match="tasks changed"):
        run_canary(FakePredictor(tasks=("click",)), [request(2)], ["click", "conversion"])
    with pytest.raises(CanaryError, match="no canary requests"):
        run_canary(FakePredictor(), [], None)
    run_canary(FakePredictor(), [request(2)], ["click", "conversion"], FakePredictor())


def test_without_canary_requests_the_swap_waits_for_traffic(tmp_path: Path) -> None:
    publish_fake_version(tmp_path, 1)
    w = watcher_for(tmp_path, canary=[])
    w.recent = RecentRequests()
    publish_fake_version(tmp_path, 2)
    assert not w.poll_once() and not w.refused and w.holder.version_number == 1
    w.recent.add(request(2))
    assert w.poll_once() and w.holder.version_number == 2


def test_in_flight_batch_finishes_on_the_old_version(tmp_path: Path) -> None:
    publish_fake_version(tmp_path, 1)
    old = FakePredictor("v0001", delay_s=0.3)
    holder = ModelHolder(old, 1)
    b = DynamicBatcher(holder.current, max_wait_us=0)
    in_flight = b.submit_nowait(request(2))
    time.sleep(0.1)  # the batch is inside score_many now
    holder.swap(FakePredictor("v0002"), 2)
    after = b.submit_nowait(request(2))
    assert in_flight.result(timeout=10)["version"] == "v0001"
    assert after.result(timeout=10)["version"] == "v0002"
    b.close()


def test_swap_of_five_versions_under_load_drops_nothing(tmp_path: Path) -> None:
    publish_fake_version(tmp_path, 1)
    cfg = ServeConfig(port=0, poll_s=0.02, backend="eager", max_wait_us=500)
    server = build_server(tmp_path, cfg, canary=[], loader=fake_loader)
    port = server.start_in_thread()
    statuses: list[int] = []
    versions: list[list[str]] = [[] for _ in range(4)]
    stop = threading.Event()

    def client(i: int) -> None:
        while not stop.is_set():
            status, body, _ = post(port, request(8, start=i))
            statuses.append(status)
            if status == 200:
                versions[i].append(json.loads(body)["version"])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        for n in range(2, 7):  # five successive versions
            publish_fake_version(tmp_path, n, bias=0.1 * n)
            deadline = time.monotonic() + 10
            while server.holder.version_number != n and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.05)
        publish_fake_version(tmp_path, 7, corrupt=True)
        time.sleep(0.2)
    finally:
        stop.set()
        for t in threads:
            t.join()
    _, body = get(port, "/healthz")
    _, metrics = get(port, "/metrics")
    server.stop()
    assert server.holder.version_number == 6 and server.holder.swaps == 5
    assert statuses and set(statuses) == {200}, sorted(set(statuses))
    for seen in versions:  # each client only ever moves forward through the versions
        assert seen == sorted(seen)
    health = json.loads(body)
    assert health["version"] == "v0006" and "7" in health["refused_versions"]
    text = metrics.decode()
    assert 'opengem_model_swaps_total{result="swapped"} 5.0' in text
    assert 'opengem_model_swaps_total{result="refused"} 1.0' in text
    assert 'version="v0006"' in text and 'version="v0005"' not in text
