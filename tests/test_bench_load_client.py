"""The serving benchmark's load generator: every request answered or counted as an error, replies read by
their Content-Length, bodies larger than a socket buffer sent whole, a closed connection or a silent server
counted and survived, and the timed part bounded by requests or by duration."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from opengem.bench.load_client import BadReply, LoadResult, parse_head, raw_request, run_load
from opengem.serve.server import ModelServer, ServeConfig
from serve_helpers import FakePredictor, request


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    server = ModelServer(FakePredictor(), ServeConfig(port=0, max_candidates=64))
    p = server.start_in_thread()
    yield p
    server.stop()


class RawServer:
    """A tiny HTTP server on a thread: reads each request by its Content-Length and answers per ``mode``:
    ``echo`` (200, the body's length), ``close`` (answers, then closes the connection), ``reset`` (answers,
    reads the next request, then closes with a reset), ``silent`` (never)."""

    def __init__(self, mode: str) -> None:
        self.mode, self.bodies = mode, []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf, answered = b"", False
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                n = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                while len(buf) < n:
                    buf += conn.recv(65536)
                body, buf = buf[:n], buf[n:]
                self.bodies.append(len(body))
                if self.mode == "silent":
                    time.sleep(5)
                    return
                if self.mode == "reset" and answered:  # the next request read, then SO_LINGER 0: the
                    # client waiting for its reply sees a reset, not an EOF
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                reply = str(len(body)).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(reply), reply))
                answered = True
                if self.mode == "close":
                    return

    def close(self) -> None:
        self.sock.close()


def test_parse_head() -> None:
    assert parse_head(b"HTTP/1.1 200 OK\r\ncontent-type: x\r\nContent-Length: 12") == (200, 12)
    assert parse_head(b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 0") == (413, 0)
    with pytest.raises(BadReply, match="Content-Length"):
        parse_head(b"HTTP/1.1 200 OK\r\ncontent-type: x")
    with pytest.raises(BadReply, match="status line"):
        parse_head(b"garbage\r\ncontent-length: 1")
    with pytest.raises(BadReply, match="Content-Length"):
        parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: -1")
    req = raw_request(b"{}")
    assert req.startswith(b"POST /predict HTTP/1.1\r\n") and b"Content-Type: application/json" in req
    assert req.endswith(b"Content-Length: 2\r\n\r\n{}")
    assert b"apache.arrow.stream" in raw_request(b"\xff\xff")


@pytest.mark.parametrize("spin", [False, True])
def test_every_request_is_answered_and_timed(port: int, spin: bool) -> None:
    bodies = [json.dumps(request(3, start=i)).encode() for i in range(4)]
    r = run_load(port, bodies, clients=3, max_requests=25, duration_s=30, spin=spin)
    assert r.errors == 0 and len(r.latencies) == 25, r.samples
    assert all(0 < t < r.seconds for t in r.latencies)


def test_an_error_reply_is_counted_with_its_reason(port: int) -> None:
    good, bad = json.dumps(request(2)).encode(), b'{"candidates": []}'
    r = run_load(port, [good, bad], clients=1, max_requests=4, duration_s=30, warmup=0)
    assert r.errors == 2 and len(r.latencies) == 2
    assert all(s.startswith("400 ") and "empty" in s for s in r.samples)


def test_warm_up_is_not_timed_and_duration_bounds_the_run(port: int) -> None:
    body = json.dumps(request(2)).encode()
    r = run_load(port, [body], clients=2, max_requests=10**9, duration_s=0.3, warmup=5)
    assert r.errors == 0 and 0.3 <= r.seconds < 5 and len(r.latencies) > 0
    stop = threading.Event()
    stop.set()
    assert run_load(port, [body], clients=2, max_requests=10**9, duration_s=60, stop=stop).latencies == []


def test_a_body_larger_than_the_socket_buffers_is_sent_whole() -> None:
    server = RawServer("echo")
    try:
        big = b"\x01" * (8 << 20)  # 8 MiB: many partial writes on a non-blocking socket
        r = run_load(server.port, [big], clients=2, max_requests=4, duration_s=60, warmup=0)
    finally:
        server.close()
    assert r.errors == 0 and len(r.latencies) == 4 and server.bodies == [len(big)] * 4


def _six_requests_to(mode: str) -> LoadResult:
    """Six requests from one client to a RawServer that drops its connections (``close`` or ``reset``):
    every request is answered or counted, some are errors, and the client reconnects after each."""
    server = RawServer(mode)
    try:
        r = run_load(server.port, [b"{}"], clients=1, max_requests=6, duration_s=60, warmup=0)
    finally:
        server.close()
    assert len(r.latencies) + r.errors >= 6 and r.errors >= 1 and len(r.latencies) >= 3
    return r


def test_a_closed_connection_is_an_error_and_the_client_reconnects() -> None:
    r = _six_requests_to("close")
    assert any("closed the connection" in s for s in r.samples)


def test_a_reset_connection_is_counted_as_closed_and_the_client_reconnects() -> None:
    """A server that closes with the client's next request unread sends a reset, which a loaded machine
    often turns the EOF case above into (the CI flake of session 9): same count, same reason."""
    r = _six_requests_to("reset")
    assert r.samples and all("server closed the connection" in s for s in r.samples)


def test_a_silent_server_times_out_each_request() -> None:
    server = RawServer("silent")
    try:
        t0 = time.perf_counter()
        r = run_load(server.port, [b"{}"], clients=1, max_requests=2, duration_s=60, warmup=0, timeout_s=0.3)
    finally:
        server.close()
    assert r.latencies == [] and r.errors == 2 and time.perf_counter() - t0 < 5
    assert all("no reply in" in s for s in r.samples)
