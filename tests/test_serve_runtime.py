"""What keeps one request fast: CPU pinning, a frozen heap (no full-GC stalls), JSON through orjson with
the stdlib's refusals, and a batcher that waits for more requests only while some are on their way."""

from __future__ import annotations

import gc
import json
import os
import time

import pyarrow as pa
import pytest

from opengem.errors import UsageError
from opengem.serve import json_codec
from opengem.serve.batcher import DynamicBatcher
from opengem.serve.runtime import GcPauses, freeze_heap, parse_cpus, pin_process, split_cpus
from opengem.serve.server import ClientError, check_request
from serve_helpers import FakePredictor, request


def test_cpu_lists_parse_and_bad_ones_are_usage_errors() -> None:
    assert parse_cpus("0") == [0] and parse_cpus("3,1") == [1, 3] and parse_cpus("0-2,5") == [0, 1, 2, 5]
    for bad in ("", "a", "2-1", "-1", "0,,x"):
        with pytest.raises(UsageError, match="--cpus"):
            parse_cpus(bad)
    assert split_cpus([0, 1, 2]) == ([0], [1, 2]) and split_cpus([4]) is None


def test_pinning_sets_the_affinity_and_refuses_a_cpu_that_does_not_exist() -> None:
    before = sorted(os.sched_getaffinity(0))
    try:
        pin_process(before[:1])
        assert sorted(os.sched_getaffinity(0)) == before[:1]
        with pytest.raises(UsageError, match="cannot run on these CPUs"):
            pin_process([100_000])
    finally:
        os.sched_setaffinity(0, before)


def test_frozen_heap_makes_a_full_collection_cheap_and_pauses_are_observed() -> None:
    junk = [[i] for i in range(200_000)]  # a big long-lived heap, as a loaded server has
    seen: list[tuple[int, float]] = []
    pauses = GcPauses(lambda gen, s: seen.append((gen, s)))
    before = gc.get_threshold()
    try:
        t0 = time.perf_counter()
        gc.collect()
        unfrozen = time.perf_counter() - t0
        freeze_heap()
        assert gc.get_freeze_count() >= len(junk) and gc.get_threshold()[0] == 20_000
        t0 = time.perf_counter()
        gc.collect()
        frozen = time.perf_counter() - t0
        assert frozen < unfrozen / 3, (frozen, unfrozen)
        assert [g for g, _ in seen].count(2) >= 3 and all(s >= 0 for _, s in seen)
    finally:
        pauses.close()
        gc.unfreeze()
        gc.set_threshold(*before)
    del junk


def test_json_codec_is_strict_and_refuses_a_nan_reply_either_way() -> None:
    for use_orjson in (True, False):
        assert json_codec.loads(b'{"a": [1, 2.5, "x"]}', use_orjson) == {"a": [1, 2.5, "x"]}
        for bad in (b'{"a": NaN}', b'{"a": Infinity}', b'{"a": [1,', b"\xff\xfe", b""):
            with pytest.raises(ValueError):
                json_codec.loads(bad, use_orjson)
        assert json.loads(json_codec.dumps({"v": "1", "s": [0.25]}, use_orjson)) == {"v": "1", "s": [0.25]}
        with pytest.raises(ValueError):
            json_codec.dumps({"version": "null", "scores": {"click": [0.5, float("nan")]}}, use_orjson)
    assert json_codec.BACKEND == "orjson"  # requirements/cpu.txt installs it


def test_lone_request_does_not_wait_but_arriving_ones_still_merge() -> None:
    model = FakePredictor()
    arriving = [0]
    b = DynamicBatcher(lambda: model, max_batch_candidates=1000, max_wait_us=2_000_000,
                       arriving=lambda: arriving[0])
    try:
        t0 = time.perf_counter()
        b.submit_nowait(request(3)).result(timeout=10)
        assert time.perf_counter() - t0 < 1.0  # not the 2 s max wait: nobody else was on the way
        arriving[0] = 1  # one more request is being read by the server
        first = b.submit_nowait(request(3))
        time.sleep(0.2)
        arriving[0] = 0
        second = b.submit_nowait(request(3, start=5))
        first.result(timeout=10), second.result(timeout=10)
        assert model.calls[-1] == 2  # the first waited for the one on its way
    finally:
        b.close()


def test_arrow_table_requests_pass_the_servers_structural_checks() -> None:
    table = pa.table({"ad_id": [1, 2, 3]})
    assert check_request({"surface": 0, "candidates": table}, 8) == 3
    with pytest.raises(ClientError) as e:
        check_request({"surface": 0, "candidates": table}, 2)
    assert e.value.status == 413
    with pytest.raises(ClientError) as e:
        check_request({"surface": 0, "candidates": table.slice(0, 0)}, 8)
    assert e.value.status == 400
