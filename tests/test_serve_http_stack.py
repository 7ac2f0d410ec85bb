"""The HTTP stack under the server: httptools + uvloop when installed (uvicorn's "standard" extras, ~3x less
server CPU per 127 KB body), h11 + asyncio otherwise; either serves the same answers, says which it runs,
and refusing one that is not installed is a one-line error before uvicorn starts."""

from __future__ import annotations

import http.client
import importlib.util
import json
import time
from argparse import Namespace

import pytest

from opengem.errors import UsageError
from opengem.serve import server as server_mod
from opengem.serve.serve_cli import check_config
from opengem.serve.server import ModelServer, ServeConfig, ServeConfigError, http_stack
from serve_helpers import FakePredictor, get, post, request

C_STACK = ("httptools", "uvloop")
PURE_PYTHON = ("h11", "asyncio")


def _without(monkeypatch: pytest.MonkeyPatch, *missing: str) -> None:
    """Make ``missing`` packages look uninstalled to the server's import check."""
    real = importlib.util.find_spec
    monkeypatch.setattr(server_mod.importlib.util, "find_spec",
                        lambda name, *a: None if name in missing else real(name, *a))


def test_auto_takes_the_c_stack_when_installed_else_the_pure_python_one(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    for name in C_STACK:
        pytest.importorskip(name)
    assert http_stack() == C_STACK
    _without(monkeypatch, "uvloop")
    assert http_stack() == ("httptools", "asyncio")
    _without(monkeypatch, "httptools", "uvloop")
    assert http_stack() == PURE_PYTHON
    assert http_stack("h11", "asyncio") == PURE_PYTHON  # always available: uvicorn depends on h11


def test_a_missing_or_unknown_stack_is_a_one_line_error(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _without(monkeypatch, "httptools", "uvloop")
    with pytest.raises(ServeConfigError, match="httptools package is not installed"):
        http_stack("httptools", "auto")
    with pytest.raises(ServeConfigError, match="uvloop package is not installed"):
        http_stack("auto", "uvloop")
    with pytest.raises(ServeConfigError, match="--http: one of auto, httptools, h11"):
        http_stack("nginx", "auto")
    with pytest.raises(UsageError, match="--loop: one of auto, uvloop, asyncio"):
        check_config(ServeConfig(loop="trio"))
    with pytest.raises(ServeConfigError):  # the server refuses it too, before binding anything
        ModelServer(FakePredictor(), ServeConfig(port=0, http="httptools"))


def test_config_flags_reach_the_server_config() -> None:
    from opengem.serve.serve_cli import resolve_config

    args = Namespace(config=None, http="h11", loop="asyncio")
    cfg = resolve_config(args)
    assert (cfg.http, cfg.loop) == PURE_PYTHON


@pytest.mark.parametrize("stack", [PURE_PYTHON, C_STACK], ids="/".join)
def test_each_stack_serves_the_same_answers_and_says_which_it_runs(stack: tuple[str, str]) -> None:
    for name in stack:
        if name not in PURE_PYTHON:
            pytest.importorskip(name)
    model = FakePredictor(version="v3")
    server = ModelServer(model, ServeConfig(port=0, max_body_bytes=200_000, http=stack[0], loop=stack[1]))
    port = server.start_in_thread()
    try:
        health = json.loads(get(port, "/healthz")[1])
        assert (health["http"], health["loop"]) == stack
        status, text, _ = post(port, request(5))
        assert status == 200 and json.loads(text) == model.score(request(5))
        status, text, _ = post(port, "x" * 300_000)  # the body limit holds whichever parser reads it
        assert status == 413 and "limit" in json.loads(text)["error"]
        status, text, _ = post(port, b"{not json")
        assert status == 400 and "not JSON" in json.loads(text)["error"]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)  # keep-alive, and no Nagle wait
        times = []
        for _ in range(15):
            t0 = time.perf_counter()
            conn.request("GET", "/healthz")
            assert conn.getresponse().read()
            times.append(time.perf_counter() - t0)
        conn.close()
        assert sorted(times)[len(times) // 2] < 0.03, times
    finally:
        server.stop()
