"""The HTTP server, in-process on an ephemeral port: JSON and Arrow bodies, batching across concurrent
clients, every 4xx path with a one-line reason, a fuzz of malformed bodies, /healthz and /metrics."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest

from opengem.serve import arrow_io
from opengem.serve.server import ModelServer, ServeConfig
from serve_helpers import FakePredictor, get, post, request

ARROW = arrow_io.ARROW_STREAM


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[ModelServer, FakePredictor, int]]:
    model = FakePredictor(version="v7", delay_s=0.002)
    cfg = ServeConfig(port=0, max_candidates=64, max_body_bytes=200_000, max_wait_us=2000)
    server = ModelServer(model, cfg)
    port = server.start_in_thread()
    yield server, model, port
    server.stop()


def error_of(status: int, body: bytes) -> str:
    obj = json.loads(body)
    assert set(obj) == {"error"} and "\n" not in obj["error"], obj
    return obj["error"]


def test_json_request_scores_as_the_predictor_does(served) -> None:  # type: ignore[no-untyped-def]
    _, model, port = served
    status, body, ctype = post(port, request(5))
    assert status == 200 and ctype.startswith("application/json")
    assert json.loads(body) == model.score(request(5))


def test_arrow_request_gives_the_same_scores_as_json(served) -> None:  # type: ignore[no-untyped-def]
    _, model, port = served
    req = request(6, surface=1)
    status, body, ctype = post(port, arrow_io.encode_request(req), ctype=ARROW)
    assert status == 200 and json.loads(body) == model.score(req)
    status, body, ctype = post(port, arrow_io.encode_request(req), ctype=ARROW, accept=ARROW)
    assert status == 200 and ctype == ARROW
    assert arrow_io.decode_reply(body) == model.score(req)


def test_arrow_null_cell_is_a_feature_not_given() -> None:
    req = {"surface": "feed", "candidates": [{"ad_id": 1, "bid": 0.5}, {"ad_id": 2}]}
    back = arrow_io.decode_request(arrow_io.encode_request(req))
    assert back == {"surface": "feed", "candidates": [{"ad_id": 1, "bid": 0.5}, {"ad_id": 2}]}


def test_concurrent_clients_are_batched(served) -> None:  # type: ignore[no-untyped-def]
    server, model, port = served
    before_calls, before_batches = len(model.calls), server.batcher.stats.batches
    results: list[int] = []

    def client(i: int) -> None:
        for j in range(5):
            results.append(post(port, request(2, start=i * 100 + j))[0])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [200] * 40
    calls = model.calls[before_calls:]
    assert sum(calls) == 40 and len(calls) < 40, calls  # some forward passes served several clients
    assert server.batcher.stats.batches - before_batches == len(calls)


@pytest.mark.parametrize(("body", "ctype", "status", "reason"), [
    ({**request(2), "candidates": [{"ad_id": 1, "colour": 2}]}, "application/json", 400, "unknown feature"),
    ({**request(2), "candidates": [{"ad_id": "seven"}]}, "application/json", 400, "expected int"),
    ({**request(2), "context": {"user_id": [1, 2]}}, "application/json", 400, "expected int"),
    ({**request(2), "surface": "moon"}, "application/json", 400, "unknown surface"),
    (request(65), "application/json", 413, "65 candidates > the server's limit of 64"),
    ({**request(1), "candidates": []}, "application/json", 400, "'candidates' is empty"),
    ({"surface": "feed"}, "application/json", 400, "needs 'candidates'"),
    ({**request(1), "candidates": [3]}, "application/json", 400, "candidates[0] must be an object"),
    ({**request(1), "context": [1]}, "application/json", 400, "'context' must be an object"),
    ("[1, 2]", "application/json", 400, "must be a JSON object"),
    ('{"candidates": [', "application/json", 400, "not JSON"),
    (b"\xff\xfe\x00garbage", "application/json", 400, "not JSON"),
    ("[" * 100_000, "application/json", 400, "JSON"),
    (b"ARROW1\x00\x00junk", ARROW, 400, "not an Arrow IPC stream"),
    ("x" * 300_000, "application/json", 413, "limit"),
    ("hello", "text/plain", 415, "Content-Type 'text/plain'"),
])
def test_bad_requests_get_a_4xx_with_one_line(served, body, ctype, status, reason) -> None:  # type: ignore[no-untyped-def]
    _, _, port = served
    got, text, _ = post(port, body, ctype=ctype)
    assert got == status, text
    assert reason in error_of(got, text)


def test_arrow_too_many_candidates_and_unknown_feature(served) -> None:  # type: ignore[no-untyped-def]
    _, _, port = served
    got, text, _ = post(port, arrow_io.encode_request(request(65)), ctype=ARROW)
    assert got == 413 and "limit of 64" in error_of(got, text)
    bad = {"surface": "feed", "candidates": [{"ad_id": 1, "colour": 5}]}
    got, text, _ = post(port, arrow_io.encode_request(bad), ctype=ARROW)
    assert got == 400 and "unknown feature 'colour'" in error_of(got, text)


def test_fuzzed_bodies_never_break_the_server(served) -> None:  # type: ignore[no-untyped-def]
    _, model, port = served
    import random

    rng = random.Random(0)
    good_json = json.dumps(request(4)).encode()
    good_arrow = arrow_io.encode_request(request(4))
    bodies: list[tuple[bytes, str]] = []
    for i in range(40):
        src, ctype = (good_json, "application/json") if i % 2 == 0 else (good_arrow, ARROW)
        kind = i % 4
        if kind in (0, 1):  # truncated
            bodies.append((src[: rng.randrange(len(src))], ctype))
        elif kind == 2:  # bytes flipped
            b = bytearray(src)
            for _ in range(5):
                b[rng.randrange(len(b))] = rng.randrange(256)
            bodies.append((bytes(b), ctype))
        else:  # random bytes
            bodies.append((bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))), ctype))
    bodies += [(b"", "application/json"), (b"", ARROW), (b"null", "application/json"),
               (json.dumps({"candidates": [{"ad_id": 10**30}]}).encode(), "application/json"),
               (b'{"candidates": [{"bid": NaN}]}', "application/json")]
    for body, ctype in bodies:
        status, text, _ = post(port, body, ctype=ctype)
        assert status < 500 or status == 503, (status, text, body[:80])
        if status != 200:
            error_of(status, text)
    status, text, _ = post(port, request(4))
    assert status == 200 and json.loads(text) == model.score(request(4))


def test_healthz_names_the_served_version(served) -> None:  # type: ignore[no-untyped-def]
    _, _, port = served
    status, body = get(port, "/healthz")
    h = json.loads(body)
    assert status == 200 and h["status"] == "ok" and h["version"] == "v7" and h["trained_through_ts"] == 1000


def test_predict_takes_only_post_and_reads_a_body_sent_in_pieces(served) -> None:  # type: ignore[no-untyped-def]
    """/predict is answered by the server's own ASGI handler, not a Starlette route: the rest of HTTP
    (another method, a chunked body) still behaves as it did."""
    import http.client

    _, model, port = served
    assert get(port, "/predict")[0] == 405
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = json.dumps(request(4)).encode()
    conn.putrequest("POST", "/predict")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    for i in range(0, len(body), 7):  # many small chunks: many http.request messages to join
        piece = body[i:i + 7]
        conn.send(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
    conn.send(b"0\r\n\r\n")
    resp = conn.getresponse()
    assert resp.status == 200 and json.loads(resp.read()) == model.score(request(4))
    conn.close()


def test_a_bug_in_the_handler_is_a_one_line_500_and_the_server_goes_on(served, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    server, model, port = served

    def broken(scope, receive):  # type: ignore[no-untyped-def]
        raise RuntimeError("handler bug\nsecond line")

    monkeypatch.setattr(server, "_score_request", broken)
    status, body, ctype = post(port, request(2))
    assert status == 500 and ctype.startswith("application/json")
    assert error_of(status, body) == "internal error: RuntimeError: handler bug second line"
    monkeypatch.undo()
    status, body, _ = post(port, request(2))
    assert status == 200 and json.loads(body) == model.score(request(2))


def test_metrics_are_prometheus_text(served) -> None:  # type: ignore[no-untyped-def]
    _, _, port = served
    post(port, request(3))
    post(port, "{", ctype="application/json")
    status, body = get(port, "/metrics")
    text = body.decode()
    assert status == 200
    ok = [ln for ln in text.splitlines() if ln.startswith('opengem_requests_total{code="200",format="json"}')]
    assert ok and float(ok[0].split()[-1]) >= 1
    assert 'opengem_request_errors_total{kind="malformed"}' in text
    assert "opengem_request_latency_seconds_bucket{le=\"0.005\"}" in text
    assert 'opengem_model_info{trained_through_ts="1000",version="v7"} 1.0' in text
    assert "opengem_batches_total" in text and "opengem_requests_in_flight 0.0" in text
    stages = {ln.split('"')[1]: float(ln.split()[-1]) for ln in text.splitlines()
              if ln.startswith("opengem_request_stage_seconds_count{")}
    assert set(stages) == {"read", "decode", "queue", "score", "reply"} and min(stages.values()) >= 1
    score = [ln for ln in text.splitlines()
             if ln.startswith('opengem_request_stage_seconds_sum{stage="score"}')]
    assert float(score[0].split()[-1]) >= 0.002  # the fake model sleeps 2 ms per batch
    assert "opengem_gc_pause_seconds" in text


def test_server_answers_healthz_while_the_model_computes() -> None:
    """The model runs on the batcher's thread, not the event loop: a slow forward pass blocks nobody else."""
    import time

    server = ModelServer(FakePredictor("slow", delay_s=1.5), ServeConfig(port=0, max_wait_us=0))
    port = server.start_in_thread()
    try:
        slow: list[int] = []
        t = threading.Thread(target=lambda: slow.append(post(port, request(1))[0]))
        t.start()
        time.sleep(0.3)
        t0 = time.perf_counter()
        assert get(port, "/healthz")[0] == 200
        assert time.perf_counter() - t0 < 1.0 and not slow  # answered while the model was still busy
        t.join(30)
        assert slow == [200]
    finally:
        server.stop()


def test_responses_are_not_held_back_by_nagle(served) -> None:  # type: ignore[no-untyped-def]
    """The listening socket says it is TCP, so asyncio sets TCP_NODELAY on every connection: without it
    each response's body waited for the client's delayed ACK, ~40 ms per request on Linux. (uvloop sets
    TCP_NODELAY on every TCP connection itself, and hands out sockets whose ``proto`` reads 0.)"""
    import http.client
    import socket
    import time

    server, _, port = served
    (listening,) = [s for srv in server._uvicorn.servers for s in srv.sockets]
    assert server.loop == "uvloop" or listening.proto == socket.IPPROTO_TCP
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    times = []
    for _ in range(15):
        t0 = time.perf_counter()
        conn.request("GET", "/healthz")
        conn.getresponse().read()
        times.append(time.perf_counter() - t0)
    conn.close()
    assert sorted(times)[len(times) // 2] < 0.03, times


def test_an_address_that_cannot_be_listened_on_is_one_serve_error() -> None:
    """A port in use, a host name that does not resolve: one ServeError naming host and port (the CLI's
    one line, exit 1), not an OSError from inside the socket module ('internal error')."""
    import socket

    from opengem.serve.server import ServeError

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        for host, p in (("127.0.0.1", port), ("nonexist.invalid", 8000)):
            with pytest.raises(ServeError, match=rf"cannot listen on {host}:{p}: .+ \(--host, --port\)$"):
                ModelServer(FakePredictor(), ServeConfig(host=host, port=p)).start_in_thread()
    finally:
        taken.close()
