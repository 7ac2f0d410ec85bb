"""The HTTP scoring server: Starlette on uvicorn, ``POST /predict``, ``/healthz``, ``/metrics``.

Starlette (the ASGI toolkit FastAPI is built on) rather than FastAPI itself: the three endpoints take raw
bodies in two formats and answer a hand-written one-line reason for every bad input, so FastAPI's
pydantic validation and OpenAPI pages would be a second validation layer in the hot path for nothing.

Every client mistake is a 4xx with ``{"error": "<one line>"}``: an unreadable body 400, a body or a
candidate list over its limit 413, an unsupported Content-Type 415, a feature the model does not know or
a value of the wrong type 400 (the Predictor's :class:`BadRequest`). A full queue is 503 (retry). Any other
failure of the model is a 500 with its one line, logged with its traceback; the server itself keeps
serving, because the batcher isolates each failure to the requests it concerns.

Graceful drain: on SIGTERM uvicorn stops accepting connections and waits (up to ``drain_timeout_s``) for
the requests in flight; the lifespan shutdown then stops the hot-swap watcher and lets the batcher score
everything still queued, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.util
import logging
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from opengem.errors import OpengemError
from opengem.serve import arrow_io, json_codec
from opengem.serve.batcher import DynamicBatcher, Scorer, ServerBusy
from opengem.serve.errors import BadRequest
from opengem.serve.hot_swap import Loader, ModelHolder, RecentRequests, VersionWatcher, published_versions
from opengem.serve.metrics import ServerMetrics
from opengem.serve.runtime import GcPauses

log = logging.getLogger("opengem.serve")
JSON_TYPE = "application/json"


@dataclass
class ServeConfig:
    """``opengem serve`` settings (TOML via ``--config``, each also a command-line flag)."""

    host: str = "127.0.0.1"
    port: int = 8000
    backend: str = "auto"  # eager | export | aoti | auto (the Predictor's choice)
    max_candidates: int = 1024  # per request; more is a 413
    max_batch_candidates: int = 8192  # per forward pass, summed over the merged requests (16 x 512)
    max_wait_us: int = 500  # how long the first request of a batch waits for others
    aoti_chunk_rows: int = 0  # AOTI scores a larger merged batch in slices of this many rows; 0 = one call
    max_queue: int = 4096  # requests waiting for the model; more is a 503
    max_body_bytes: int = 16 * 1024 * 1024
    poll_s: float = 2.0  # hot swap: how often versions/ is looked at
    canary_atol: float = 1e-4  # hot swap: eager vs serving backend on the canary requests
    drain_timeout_s: int = 30  # SIGTERM: how long requests in flight may take to finish
    keep_alive_s: int = 75  # an idle keep-alive connection is closed after this (uvicorn's default is 5)
    cpus: str = ""  # "0" or "0,2" or "1-3": pin the server to these CPUs (os.sched_setaffinity); "" = all
    gc_freeze: bool = True  # freeze the heap after loading (runtime.freeze_heap): no long GC pauses
    http: str = "auto"  # auto | httptools | h11: uvicorn's HTTP parser (auto: httptools when installed)
    loop: str = "auto"  # auto | uvloop | asyncio: the event loop (auto: uvloop when installed)


HTTP_PARSERS = ("httptools", "h11")  # fastest first: "auto" takes the first one importable
EVENT_LOOPS = ("uvloop", "asyncio")


def http_stack(http: str = "auto", loop: str = "auto") -> tuple[str, str]:
    """The (HTTP parser, event loop) uvicorn runs: uvicorn's "standard" extras, httptools (a C parser) and
    uvloop (libuv), when importable, else the pure-Python h11 and asyncio.

    Why choose here rather than leave uvicorn's own "auto": the choice is then known, so the startup line
    and /healthz can say what a measurement ran on, and asking for one that is not installed is a one-line
    error instead of an ImportError inside uvicorn's startup."""
    return _pick("http", http, HTTP_PARSERS), _pick("loop", loop, EVENT_LOOPS)


def _pick(what: str, wanted: str, choices: tuple[str, ...]) -> str:
    if wanted != "auto" and wanted not in choices:
        raise ServeConfigError(f"--{what}: one of auto, {', '.join(choices)} (got {wanted!r})")
    for name in choices if wanted == "auto" else (wanted,):
        if name == "asyncio" or importlib.util.find_spec(name) is not None:
            return name
    raise ServeConfigError(f"--{what} {wanted}: the {wanted} package is not installed (pip install "
                           f"{wanted}, or --{what} auto)")


class ServeError(OpengemError, RuntimeError):
    """Nothing servable: no version of the run loads."""


class ServeConfigError(OpengemError, ValueError):
    """A serve setting that cannot be honoured (an HTTP parser or event loop that is not installed)."""


class ClientError(Exception):
    """A request refused before it reaches the model: HTTP status, metric kind and one-line reason."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


def check_request(req: Any, max_candidates: int) -> int:
    """The structural checks every request gets before it is queued; returns its candidate count.
    ``candidates`` is a list of objects, or the Arrow table of an Arrow body (its columns are checked by
    the Predictor)."""
    if not isinstance(req, dict):
        raise ClientError(400, "bad_request", f"request must be a JSON object, got {type(req).__name__}")
    cands = req.get("candidates")
    if isinstance(cands, pa.Table):
        if cands.num_rows == 0:
            raise ClientError(400, "bad_request", "'candidates' is empty: nothing to score")
        if cands.num_rows > max_candidates:
            raise ClientError(413, "too_many_candidates", f"{cands.num_rows} candidates > the server's "
                              f"limit of {max_candidates} per request")
        return cands.num_rows
    if not isinstance(cands, list):
        raise ClientError(400, "bad_request", "request needs 'candidates': a list of feature objects")
    if not cands:
        raise ClientError(400, "bad_request", "'candidates' is empty: nothing to score")
    if len(cands) > max_candidates:
        raise ClientError(413, "too_many_candidates",
                          f"{len(cands)} candidates > the server's limit of {max_candidates} per request")
    bad = next((i for i, c in enumerate(cands) if not isinstance(c, dict)), None)
    if bad is not None:
        raise ClientError(400, "bad_request", f"candidates[{bad}] must be an object of feature values")
    if "context" in req and not isinstance(req["context"], dict):
        raise ClientError(400, "bad_request", "'context' must be an object of feature values")
    return len(cands)


class ModelServer:
    """One model (or a run's successive versions) behind the three endpoints."""

    def __init__(self, model: Scorer, cfg: ServeConfig | None = None, watcher: VersionWatcher | None = None,
                 holder: ModelHolder | None = None, recent: RecentRequests | None = None) -> None:
        self.cfg = cfg or ServeConfig()
        self.metrics = ServerMetrics()
        self.holder = holder or ModelHolder(model)
        self.recent = recent or RecentRequests()
        self.watcher = watcher
        if watcher is not None:
            watcher.on_swap = self._on_swap
            watcher.on_refuse = lambda number, reason: self.metrics.swaps.labels(result="refused").inc()
        self.metrics.set_model(getattr(model, "version", "?"), getattr(model, "trained_through_ts", None))
        self._gc_pauses = GcPauses(self.metrics.on_gc)
        c = self.cfg
        self.http, self.loop = http_stack(c.http, c.loop)
        self._arriving = 0  # /predict requests received and not yet queued (read on the batcher thread)
        self.batcher = DynamicBatcher(self.holder.current, c.max_batch_candidates, c.max_wait_us, c.max_queue,
                                      on_batch=self.metrics.on_batch, arriving=lambda: self._arriving)
        # POST /predict is answered by __call__ itself; Starlette keeps the rest (and the 405 of a GET)
        self.starlette = Starlette(routes=[Route("/predict", _method_not_allowed, methods=["POST"]),
                                           Route("/healthz", self.healthz, methods=["GET"]),
                                           Route("/metrics", self.metrics_page, methods=["GET"])],
                                   lifespan=self._lifespan)
        self.app = self
        self._uvicorn: uvicorn.Server | None = None
        self._port = 0
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ endpoints
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The ASGI app uvicorn serves: ``POST /predict`` straight to :meth:`_predict`, the rest to Starlette.

        Why not a Starlette route: on the hot path its request object, body stream, router and two
        exception middlewares were ~10 Python frames per request on the core that also runs the model
        (12-16 % of the event loop's CPU per 512-candidate request, measured); they add nothing to one POST
        whose every outcome this server already turns into a status and a one-line reason. A /predict
        with another method still goes to Starlette, which answers 405 as before."""
        if scope["type"] == "http" and scope["path"] == "/predict" and scope["method"] == "POST":
            await self._predict(scope, receive, send)
        else:
            await self.starlette(scope, receive, send)

    async def _predict(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            status, media_type, payload = await self._score_request(scope, receive)
        except Exception as e:  # noqa: BLE001 - a bug of this handler: a 500, as Starlette's middleware gave
            log.exception("predict failed")
            status, media_type = 500, JSON_TYPE
            payload = self._error_body("json", 500, "internal", f"internal error: {type(e).__name__}: {e}")
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", media_type.encode("latin-1")),
                                (b"content-length", str(len(payload)).encode("latin-1"))]})
        await send({"type": "http.response.body", "body": payload})

    async def _score_request(self, scope: dict[str, Any], receive: Any) -> tuple[int, str, bytes]:
        """(status, content type, body) of one /predict request."""
        t0 = time.perf_counter()
        headers = _headers(scope)
        ctype = headers.get(b"content-type", b"application/json").decode("latin-1").split(";")[0]
        ctype = ctype.strip().lower()
        fmt = "arrow" if ctype == arrow_io.ARROW_STREAM else "json"
        self.metrics.in_flight.inc()
        self._arriving += 1  # until queued: the batcher waits for more only while some are on the way
        arriving = True
        try:
            if ctype not in (JSON_TYPE, arrow_io.ARROW_STREAM):
                raise ClientError(415, "content_type", f"Content-Type {ctype!r} not served; send "
                                  f"{JSON_TYPE} or {arrow_io.ARROW_STREAM}")
            body = await self._read_body(headers, receive)
            t_read = time.perf_counter()
            req = self._decode(body, fmt, self._takes_tables())
            t_decoded = time.perf_counter()
            n = check_request(req, self.cfg.max_candidates)
            ticket = self.batcher.enqueue(req)
            self._arriving -= 1
            arriving = False
            reply = await asyncio.wrap_future(ticket.future)
            t_scored = time.perf_counter()
            media_type, payload = self._encode(reply, fmt, headers.get(b"accept", b"").decode("latin-1"))
        except ClientError as e:
            return self._error(fmt, e.status, e.kind, str(e))
        except BadRequest as e:
            return self._error(fmt, 400, "bad_request", str(e))
        except ServerBusy as e:
            return self._error(fmt, 503, "busy", str(e))
        except ClientDisconnect:
            return self._error(fmt, 400, "disconnected", "client went away before its body was read")
        except Exception as e:  # noqa: BLE001 - the model failed on this request; the server goes on
            log.exception("predict failed")
            return self._error(fmt, 500, "internal", f"internal error: {type(e).__name__}: {e}")
        finally:
            if arriving:
                self._arriving -= 1
            self.metrics.in_flight.dec()
        self.recent.add(req)
        done = time.perf_counter()
        self.metrics.requests.labels(format=fmt, code="200").inc()
        self.metrics.candidates.observe(n)
        self.metrics.latency.observe(done - t0)
        self.metrics.observe_stages(read=t_read - t0, decode=t_decoded - t_read,
                                    queue=ticket.started - ticket.queued,
                                    score=ticket.finished - ticket.started, reply=done - t_scored)
        return 200, media_type, payload

    async def healthz(self, request: Request) -> Response:
        model = self.holder.current()
        return JSONResponse({"status": "ok", "version": getattr(model, "version", "?"),
                             "trained_through_ts": getattr(model, "trained_through_ts", None),
                             "swaps": self.holder.swaps, "http": self.http, "loop": self.loop,
                             "refused_versions": dict(self.watcher.refused) if self.watcher else {}})

    async def metrics_page(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=self.metrics.content_type)

    # ------------------------------------------------------------------ helpers
    async def _read_body(self, headers: dict[bytes, bytes], receive: Any) -> bytes:
        limit = self.cfg.max_body_bytes
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ClientError(413, "body_too_large", f"body of {declared.decode()} bytes > limit of {limit}")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise ClientError(413, "body_too_large", f"body over the limit of {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _takes_tables(self) -> bool:
        """Whether the served model scores an Arrow body's candidates as a table (the Predictor does;
        a model that does not gets ``{feature: value}`` rows)."""
        return bool(getattr(self.holder.current(), "takes_arrow_tables", False))

    @staticmethod
    def _decode(body: bytes, fmt: str, tables: bool = False) -> Any:
        if fmt == "arrow":
            return arrow_io.decode_request(body, tables=tables)
        try:
            return json_codec.loads(body)
        except (ValueError, UnicodeDecodeError) as e:  # json.JSONDecodeError and orjson's are ValueErrors
            raise ClientError(400, "malformed", f"body is not JSON ({_one_line(e)})") from None
        except RecursionError:
            raise ClientError(400, "malformed", "body is JSON nested too deeply") from None

    @staticmethod
    def _encode(reply: dict[str, Any], fmt: str, accept: str) -> tuple[str, bytes]:
        if fmt == "arrow" and arrow_io.ARROW_STREAM in accept:
            return arrow_io.ARROW_STREAM, arrow_io.encode_reply(reply)
        return JSON_TYPE, json_codec.dumps(reply)  # a NaN score: a 500, never "null"

    def _error(self, fmt: str, status: int, kind: str, message: str) -> tuple[int, str, bytes]:
        return status, JSON_TYPE, self._error_body(fmt, status, kind, message)

    def _error_body(self, fmt: str, status: int, kind: str, message: str) -> bytes:
        self.metrics.requests.labels(format=fmt, code=str(status)).inc()
        self.metrics.errors.labels(kind=kind).inc()
        return json_codec.dumps({"error": _one_line(message)})

    def _on_swap(self, model: Scorer) -> None:
        if self.cfg.gc_freeze:
            gc.freeze()  # the new version's objects join the permanent generation (runtime.freeze_heap)
        self.metrics.set_model(getattr(model, "version", "?"), getattr(model, "trained_through_ts", None))
        self.metrics.swaps.labels(result="swapped").inc()

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        if self.watcher is not None:
            self.watcher.start()
        yield
        # drain: uvicorn has stopped accepting and waited for the requests in flight
        if self.watcher is not None:
            await asyncio.to_thread(self.watcher.stop)
        await asyncio.to_thread(self.batcher.close, self.cfg.drain_timeout_s)
        self._gc_pauses.close()

    # ------------------------------------------------------------------ running
    def _make_uvicorn(self) -> tuple[uvicorn.Server, socket.socket]:
        # proto IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on sockets that say they
        # are TCP, and without it Nagle + the client's delayed ACK add ~40 ms to every response
        family = socket.AF_INET6 if ":" in self.cfg.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.cfg.host, self.cfg.port))
        except OSError as e:  # in use, not an address of this machine, a host name that does not resolve
            sock.close()
            why = e.strerror or str(e)
            raise ServeError(f"cannot listen on {self.cfg.host}:{self.cfg.port}: {why} (--host, --port)"
                             ) from None
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="on",
                                timeout_graceful_shutdown=self.cfg.drain_timeout_s, backlog=2048,
                                timeout_keep_alive=self.cfg.keep_alive_s, http=self.http, loop=self.loop,
                                proxy_headers=False)  # nothing reads the client's address: no middleware
        self._uvicorn = uvicorn.Server(config)
        return self._uvicorn, sock

    @property
    def port(self) -> int:
        return self._port

    def serve_forever(self) -> None:
        """Serve in this (main) thread until SIGTERM or SIGINT, then drain and return.

        uvicorn re-raises the signal it caught once it has drained; no-op SIGTERM and SIGINT handlers
        installed first make that a clean return (exit 0, Ctrl-C included, as docs/SERVING.md says) instead
        of the default handler's kill (SIGTERM) or a KeyboardInterrupt (SIGINT: exit 130, "interrupted").
        """
        server, sock = self._make_uvicorn()
        self._port = sock.getsockname()[1]
        log.warning("opengem serve: listening on http://%s:%d (model %s; http %s, loop %s)", self.cfg.host,
                    self._port, getattr(self.holder.current(), "version", "?"), self.http, self.loop)
        previous = {s: signal.signal(s, lambda signum, frame: None) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            server.run(sockets=[sock])
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def start_in_thread(self, timeout: float = 30.0) -> int:
        """Serve from a background thread (tests, the benchmark); returns the bound port once it answers."""
        server, sock = self._make_uvicorn()
        self._port = sock.getsockname()[1]
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                                        name="opengem-uvicorn")
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self._port

    def stop(self, timeout: float = 30.0) -> None:
        """Drain and stop a server started with :meth:`start_in_thread`."""
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)


def build_server(model_path: Path, cfg: ServeConfig, canary: list[dict[str, Any]], loader: Loader,
                 hot_swap: bool = True) -> ModelServer:
    """A server for an export folder or a run folder (hot-swapped when it has versions).

    ``loader(path, backend)`` makes a predictor (``serve_cli.PredictorLoader`` in ``opengem serve``; the
    tests pass a fake, which keeps torch out of them)."""
    versions = published_versions(model_path)
    if not versions:
        return ModelServer(loader(model_path, cfg.backend), cfg)
    model, number = None, None
    for n, path in reversed(versions):
        try:
            model, number = loader(path, cfg.backend), n
            break
        except Exception as e:  # noqa: BLE001 - a broken newest version: serve the one before it
            log.warning("serve: version v%04d (%s) does not load (%s: %s); trying the one before",
                        n, path, type(e).__name__, " ".join(str(e).split())[:300])
    if model is None:
        raise ServeError(f"{model_path}: none of its {len(versions)} published versions loads (see the "
                         "warnings above)")
    holder, recent = ModelHolder(model, number), RecentRequests()
    watcher = None
    if hot_swap:
        watcher = VersionWatcher(model_path, holder, loader, cfg.backend, cfg.poll_s, canary, recent,
                                 cfg.canary_atol)
    return ModelServer(model, cfg, watcher=watcher, holder=holder, recent=recent)


def _headers(scope: dict[str, Any]) -> dict[bytes, bytes]:
    """An ASGI scope's headers by lower-case name (ASGI servers send the names lower-cased)."""
    return {k.lower(): v for k, v in scope["headers"]}


async def _method_not_allowed(request: Request) -> Response:  # pragma: no cover - __call__ answers POST
    raise AssertionError("POST /predict is answered by ModelServer.__call__")


def _one_line(e: BaseException | str) -> str:
    return " ".join(str(e).split())[:500]
