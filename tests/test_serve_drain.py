"""SIGTERM drains the server: the request in flight is answered, then the process exits 0; and the
``opengem serve`` command line refuses bad settings in one line."""

from __future__ import annotations

import argparse
import http.client
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cli_helpers import one_error_line, run_cli
from opengem.config import ConfigError, load_config, save_config
from opengem.serve.serve_cli import add_arguments, resolve_config
from opengem.serve.server import ServeConfig
from serve_helpers import get, post, request

TESTS = Path(__file__).parent
SERVER_SCRIPT = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from serve_helpers import FakePredictor
from opengem.serve.server import ModelServer, ServeConfig
ModelServer(FakePredictor("slow", delay_s=1.5), ServeConfig(port=0, max_wait_us=0)).serve_forever()
print("drained", flush=True)
"""


def wait_listening(proc: subprocess.Popen) -> int:  # type: ignore[type-arg]
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            while time.monotonic() < deadline:
                try:
                    if get(port, "/healthz")[0] == 200:
                        return port
                except OSError:
                    time.sleep(0.05)
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"server did not start: {proc.stderr.read()}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_finishes_the_request_in_flight_and_exits_0(signum: int) -> None:
    """SIGTERM, and Ctrl-C as docs/SERVING.md says (it exited 130, "interrupted", without draining)."""
    proc = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        port = wait_listening(proc)
        result: list[tuple[int, bytes, str]] = []
        t = threading.Thread(target=lambda: result.append(post(port, request(2))))
        t.start()
        time.sleep(0.5)  # the request is inside the slow model now
        proc.send_signal(signum)
        t.join(30)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert result and result[0][0] == 200 and b'"version":"slow"' in result[0][1]
    assert proc.returncode == 0, err
    assert "drained" in out
    with pytest.raises(OSError):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/healthz")


COMPILING_SCRIPT = """
import subprocess, sys
import opengem.serve.serve_cli as serve_cli
from opengem.cli import main

def slow_export(spec, out, backend):  # an AOTI compile: inductor runs the C++ compiler with subprocess.run
    subprocess.run(["sh", "-c", 'echo $$ > "$0" && exec sleep 120', sys.argv[2]], check=True)

serve_cli.export_run = slow_export
sys.exit(main(["serve", "--model", sys.argv[1], "--backend", "aoti", "--port", "0"]))
"""


def test_sigterm_while_compiling_before_listening_stops_promptly_and_cleans_up(tmp_path) -> None:
    """SIGTERM during the AOTI compile a run folder needs before the server listens: the command stops
    within seconds with 143 and one line, its compiler child is gone and its scratch folder removed."""
    run, pid_file = tmp_path / "run", tmp_path / "compiler.pid"
    run.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", COMPILING_SCRIPT, str(run), str(pid_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        scratch = None
        deadline = time.monotonic() + 120  # the import of torch on a loaded 2-core machine
        while scratch is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            m = re.search(r"compiling .* into (\S+)", line)
            if m:
                scratch = Path(m.group(1)).parent
            elif not line and proc.poll() is not None:
                raise AssertionError(f"serve exited before compiling: {proc.stderr.read()}")
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert scratch is not None and scratch.is_dir()
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert took < 10, took
    assert "SIGTERM while loading" in err and "stopped before listening" in err and "Traceback" not in err
    assert not scratch.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "no/such/run"], "--model no/such/run: no such folder"),
    (["--model", ".", "--port", "70000"], "--port: must be in 0..65535"),
    (["--model", ".", "--max-candidates", "0"], "--max-candidates: must be >= 1"),
    (["--model", ".", "--max-wait-us", "-5"], "--max-wait-us: must be >= 0"),
    (["--model", ".", "--aoti-chunk-rows", "-1"], "--aoti-chunk-rows: must be >= 0"),
    (["--model", ".", "--cpus", "0-x"], "--cpus: a list such as 0 or 0,2 or 1-3"),
])
def test_serve_cli_refuses_bad_settings_in_one_line(capsys, args: list[str], message: str) -> None:  # type: ignore[no-untyped-def]
    rc, err = run_cli(capsys, ["serve", *args])
    assert rc == 2 and message in one_error_line(err, "serve")


def test_serve_config_from_toml_flags_win_and_round_trips(tmp_path: Path) -> None:
    f = tmp_path / "serve.toml"
    f.write_text("port = 9100\nmax_wait_us = 250\nmax_batch_candidates = 4096\npoll_s = 0.5\n"
                 "aoti_chunk_rows = 1024\n")
    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = resolve_config(p.parse_args(["--model", ".", "--config", str(f), "--max-wait-us", "100"]))
    assert (cfg.port, cfg.max_wait_us, cfg.max_batch_candidates, cfg.poll_s) == (9100, 100, 4096, 0.5)
    assert cfg.aoti_chunk_rows == 1024
    save_config(cfg, tmp_path / "back.toml")
    assert load_config(ServeConfig, tmp_path / "back.toml") == cfg
    f.write_text("max_wait_us = 250\nmax_wiat_us = 3\n")
    with pytest.raises(ConfigError, match="max_wiat_us"):
        resolve_config(p.parse_args(["--model", ".", "--config", str(f)]))
