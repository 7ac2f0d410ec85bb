"""The serving benchmark's load generator: closed-loop HTTP/1.1 clients on keep-alive connections, all
driven by ONE thread over non-blocking sockets (what wrk does in C), with requests built once.

Why not a thread per client with ``http.client`` (what ``bench serve`` used): on this project's machines
(2-vCPU virtual machines whose idle vCPUs halt; no cpuidle polling) a client thread that blocks on its
socket while the server computes puts its vCPU to sleep, and the hypervisor takes ~3-5 ms to wake it
for 1-3 % of requests. That is the *client's* latency, not the server's, and it was most of the p99 of
one client (measured: echo app p99 4.05 ms with a blocking client, 0.26 ms spinning, same server). With
``spin=True`` this loop polls its sockets without sleeping, so its vCPU never halts; it is only right
when the clients have a CPU of their own (``bench serve`` pins them away from the server's), otherwise
the spinning would take the server's core, so ``spin=False`` waits in ``select`` instead. ``http.client``
also parsed every reply's headers with the email package and sent headers and body in two writes:
~0.9 ms per request more than this client at p50, measured against the same server.

Replies are read by their ``Content-Length`` (the server always sends one); a connection the server
closes or a malformed reply is an error, counted with its reason, and the client reconnects.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

from opengem.serve.arrow_io import ARROW_STREAM

HEADER_END = b"\r\n\r\n"


def raw_request(body: bytes, host: str = "127.0.0.1", accept: str | None = None) -> bytes:
    """The bytes of ``POST /predict`` with ``body`` (a JSON body starts with ``{``, anything else is an
    Arrow IPC stream), ready to send in one write; ``accept``: the reply format asked for."""
    ctype = "application/json" if body[:1] == b"{" else ARROW_STREAM
    extra = f"Accept: {accept}\r\n" if accept else ""
    head = (f"POST /predict HTTP/1.1\r\nHost: {host}\r\nContent-Type: {ctype}\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode("latin-1") + body


class BadReply(Exception):
    """A reply this client cannot read (no status line, no Content-Length)."""


def parse_head(head: bytes) -> tuple[int, int]:
    """(status, content length) of a reply's header block (without the blank line)."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise BadReply(f"bad status line {lines[0][:80]!r}")
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            v = value.strip()
            if not v.isdigit():
                raise BadReply(f"bad Content-Length {v[:40]!r}")
            return int(parts[1]), int(v)
    raise BadReply("reply without Content-Length")


@dataclass
class _Conn:
    """One client: its socket, what is left to send of the request in flight, and what came back."""

    index: int
    sock: socket.socket
    pending: memoryview | None = None
    buf: bytearray = field(default_factory=bytearray)
    started: float = 0.0
    warmup_left: int = 0
    timed: bool = False


@dataclass
class LoadResult:
    """Latencies (s) of the timed successful requests, failed requests (warm-up included), wall seconds
    of the timed part, and the first few error texts."""

    latencies: list[float]
    errors: int
    seconds: float
    samples: list[str]


def run_load(port: int, bodies: list[bytes], clients: int, max_requests: int, duration_s: float,
             stop: threading.Event | None = None, warmup: int = 3, spin: bool = False,
             host: str = "127.0.0.1", timeout_s: float = 60.0, accept: str | None = None) -> LoadResult:
    """``clients`` closed-loop connections: each sends a request, waits for its whole reply, sends the next.

    ``warmup`` requests per client first (untimed; a failure counts). Then the timed part runs until
    ``max_requests`` have been sent and answered, ``duration_s`` has passed or ``stop`` is set; a request in
    flight then still finishes. Request ``i`` of client ``c`` is ``bodies[(c * 7919 + i) % len(bodies)]``.
    A request unanswered for ``timeout_s`` fails its connection (counted) and the client reconnects."""
    if clients < 1:
        raise ValueError(f"clients must be >= 1, got {clients}")
    requests = [raw_request(b, host, accept) for b in bodies]
    sel = selectors.DefaultSelector()
    conns = [_Conn(c, _connect(host, port), warmup_left=warmup) for c in range(clients)]
    latencies: list[float] = []
    errors: list[str] = []
    sent = 0
    timing = warmup == 0
    t0 = time.perf_counter()
    stop_at = t0 + duration_s if timing else float("inf")
    for c in conns:
        sel.register(c.sock, selectors.EVENT_READ, c)

    def may_send() -> bool:
        return sent < max_requests and time.perf_counter() < stop_at and not (stop and stop.is_set())

    def send_next(c: _Conn) -> None:
        nonlocal sent
        if c.warmup_left > 0:
            c.warmup_left -= 1
            c.timed = False
        elif timing and may_send():
            sent += 1
            c.timed = True
        else:
            c.pending = None
            c.started = 0.0
            return
        k = c.index * 7919 + (sent if c.timed else c.warmup_left)
        c.pending = memoryview(requests[k % len(requests)])
        c.started = time.perf_counter()
        flush(c)

    def flush(c: _Conn) -> None:
        """Send what the socket takes now; ask to be told when it takes more (a large body, a full buffer)."""
        _flush(c)
        sel.modify(c.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if c.pending else 0), c)

    def fail(c: _Conn, why: str) -> None:
        errors.append(why)
        sel.unregister(c.sock)
        c.sock.close()
        c.buf, c.pending, c.started = bytearray(), None, 0.0
        try:
            c.sock = _connect(host, port)
        except OSError as e:  # the server is gone: this client stops (the others will see it too)
            errors.append(f"-1 cannot reconnect: {type(e).__name__}: {e}")
            c.warmup_left = 0
            return
        sel.register(c.sock, selectors.EVENT_READ, c)
        send_next(c)

    for c in conns:
        send_next(c)
    while True:
        if not timing and all(c.warmup_left == 0 and c.started == 0.0 for c in conns):
            timing, t0 = True, time.perf_counter()  # every client has warmed up: the timed part starts
            stop_at = t0 + duration_s
            for c in conns:
                send_next(c)
        busy = [c for c in conns if c.started]
        if not busy:
            break
        for key, events in sel.select(0 if spin else 0.05):
            c = key.data
            if events & selectors.EVENT_WRITE and c.pending is not None:
                flush(c)
            if not events & selectors.EVENT_READ:
                continue
            try:
                chunk = c.sock.recv(1 << 17)
            except BlockingIOError:
                continue
            except ConnectionResetError:  # closed with our next request unread: a reset, not an EOF
                fail(c, "-1 server closed the connection (reset)")
                continue
            except OSError as e:
                fail(c, f"-1 {type(e).__name__}: {e}")
                continue
            if not chunk:
                fail(c, "-1 server closed the connection")
                continue
            c.buf += chunk
            done = _reply(c)
            if done is None:
                continue
            status, body = done
            c.pending = None  # (a server may answer before it has read all of a refused body)
            if status == 200:
                if c.timed:
                    latencies.append(time.perf_counter() - c.started)
            else:
                errors.append(f"{status} {body[:200].decode('utf-8', 'replace')}"
                              + ("" if c.timed else " (warm-up)"))
            send_next(c)
        now = time.perf_counter()
        for c in busy:
            if c.started and now - c.started > timeout_s:
                fail(c, f"-1 no reply in {timeout_s:.0f} s")
    for c in conns:
        if c.sock.fileno() >= 0:
            sel.unregister(c.sock)
            c.sock.close()
    sel.close()
    return LoadResult(latencies, len(errors), time.perf_counter() - t0, errors[:5])


def _connect(host: str, port: int) -> socket.socket:
    s = socket.create_connection((host, port), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.setblocking(False)
    return s


def _flush(c: _Conn) -> None:
    """Send what the socket takes of the request in flight (a large body may need several writes)."""
    while c.pending:
        try:
            n = c.sock.send(c.pending)
        except BlockingIOError:
            return
        except OSError:
            c.pending = None  # the read side sees the broken connection and counts it
            return
        c.pending = c.pending[n:]
    c.pending = None


def _reply(c: _Conn) -> tuple[int, bytes] | None:
    """(status, body) once the whole reply is in ``c.buf`` (and taken out of it); None before."""
    end = c.buf.find(HEADER_END)
    if end < 0:
        return None
    try:
        status, length = parse_head(bytes(c.buf[:end]))
    except BadReply as e:
        c.buf.clear()
        return -1, str(e).encode()
    total = end + len(HEADER_END) + length
    if len(c.buf) < total:
        return None
    body = bytes(c.buf[end + len(HEADER_END):total])
    del c.buf[:total]
    return status, body
