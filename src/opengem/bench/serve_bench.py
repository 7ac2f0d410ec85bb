"""``opengem bench serve``: a bounded loopback load test of ``opengem serve``.

For each backend a real ``opengem serve`` process is started on a free loopback port (its own process:
the load generator's Python threads must not share the server's interpreter lock), then, for every
(candidates per request, concurrent clients) cell, closed-loop clients on keep-alive connections send
requests until ``--requests`` have been answered or ``--duration`` seconds have passed, whichever comes
first: the benchmark always stops by itself. Each cell reports p50/p95/p99 latency as the client saw it
(send to last byte) and requests/s, after a short warm-up that is not timed.

The swap phase serves a scratch run folder whose ``versions/`` the benchmark itself publishes: while
clients load the server, it publishes ``--swap-versions`` successive versions (copies of the model, or of
the source run's versions in turn) and waits for each to be swapped in; every failed request counts.

Requests are built from real rows: ``--data DIR`` (a canonical dataset: one candidate per row, the row's
surface for the request) or ``--requests-file FILE.json`` (request objects whose candidates are pooled).
Candidates are cycled to the size each cell asks for.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from opengem.bench.isoflop_report import json_safe
from opengem.bench.load_client import run_load
from opengem.bench.machine import load_average
from opengem.data.adapters.common import AdapterError
from opengem.data.adapters.encoders_io import ENCODERS_FILE, read_encoders
from opengem.data.dataset import Dataset
from opengem.errors import TrainError, UsageError
from opengem.serve import arrow_io
from opengem.serve.artifact import ENCODING
from opengem.serve.hot_swap import MANIFEST, VERSIONS, published_versions
from opengem.serve.runtime import available_cpus, split_cpus
from opengem.serve.table_codec import TABLE, encoders_from_json, raw_columns

WARMUP_PER_CLIENT = 3


@dataclass
class CellResult:
    """One (backend, candidates, clients) cell of the table."""

    backend: str
    candidates: int
    clients: int
    requests: int
    errors: int
    seconds: float
    requests_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    phase: str = "steady"  # or "swap"
    error_samples: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- requests
def candidate_pool(data: str | None, requests_file: str | None, limit: int = 4096, raw: bool = False
                   ) -> tuple[list[dict[str, Any]], list[Any], dict[str, Any]]:
    """(candidate rows, surfaces, context) to build requests from. ``raw``: the model takes raw source
    values (an artifact of data made by ``opengem convert table``): the rows are read from the
    dataset's source files, not its canonical Parquet (see :func:`_rows_from_sources`)."""
    if requests_file:
        try:
            reqs = json.loads(Path(requests_file).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UsageError(f"--requests-file {requests_file}: not a readable JSON file ({e})") from None
        reqs = reqs if isinstance(reqs, list) else [reqs]
        if not all(isinstance(r, dict) for r in reqs):
            raise UsageError(f"--requests-file {requests_file}: a request or a list of requests (JSON "
                             "objects with 'candidates'), as POST /predict takes")
        cands = [c for r in reqs for c in r.get("candidates", [])]
        if not cands:
            raise UsageError(f"--requests-file {requests_file}: no candidates in it")
        return cands[:limit], [r.get("surface", 0) for r in reqs], reqs[0].get("context", {})
    if data and raw:
        return _rows_from_sources(Path(data), limit)
    if data:
        return _rows_from_data(Path(data), limit)
    raise UsageError("give --data DIR (a dataset the model reads) or --requests-file FILE.json")


def _rows_from_data(data: Path, limit: int) -> tuple[list[dict[str, Any]], list[Any], dict[str, Any]]:
    ds = Dataset(data)
    cols = ds.schema.feature_columns()
    rows: list[dict[str, Any]] = []
    surfaces: list[Any] = []
    for f in ds.files("@all"):
        t = pq.read_table(f, columns=[*cols, ds.schema.surface_column]).slice(0, limit - len(rows))
        surfaces += t.column(ds.schema.surface_column).to_pylist()
        rows += t.select(cols).to_pylist()
        if len(rows) >= limit:
            break
    if not rows:
        raise UsageError(f"--data {data}: no rows")
    return rows, surfaces, {}


def takes_raw_values(model: Path, data: str | None) -> bool:
    """Whether ``model`` scores raw source values: an export folder whose ``encoding.json`` is of kind
    ``table``, or a run whose dataset holds the importer's encoders (``Predictor.load(RUN)`` reads them)."""
    encoding = model / ENCODING
    if encoding.is_file():
        try:
            return json.loads(encoding.read_text()).get("kind") == TABLE
        except (OSError, ValueError, AttributeError):
            return False
    return bool(data) and (Path(data) / ENCODERS_FILE).is_file()


def _rows_from_sources(data: Path, limit: int) -> tuple[list[dict[str, Any]], list[Any], dict[str, Any]]:
    """Raw candidate rows of a converted dataset: the first rows of the source files its summary.json
    names, as the client of a served model would send them: categorical values as the source holds them,
    numbers as floats, an empty number as null. The Predictor encodes them itself (the importer's
    encoders), so the served rows are the converted ones; CSV/TSV are read as text."""
    try:
        summary = json.loads((data / "summary.json").read_text())
        files = [Path(f) for fs in summary["sources"].values() for f in fs]
        record = read_encoders(data)  # digests checked
    except (OSError, ValueError, KeyError, TypeError, AttributeError, AdapterError) as e:
        raise UsageError(f"--data {data}: cannot read its sources and encoders ({e})") from None
    if record is None:
        raise UsageError(f"--data {data}: holds no encoders.json (not made by opengem convert table)")
    enc = encoders_from_json(record)
    kinds = raw_columns(enc)
    text = set(record.get("text_columns") or ())
    surface_col = enc.spec.surface
    table = _read_source_head(files, limit, [*kinds, *([surface_col] if surface_col else [])])
    if table is None:
        raise UsageError(f"--data {data}: its sources ({', '.join(map(str, files[:3]))}) are gone or "
                         "unreadable; give --requests-file with raw request objects instead")
    cols = {name: table.column(name).to_pylist() for name in kinds}
    rows: list[dict[str, Any]] = []
    for i in range(table.num_rows):
        row = {}
        for name, kind in kinds.items():
            v = cols[name][i]
            if kind == "num":
                row[name] = None if v in (None, "") else float(v)
            elif kind == "cat":
                row[name] = _raw_cat(v, name in text, enc.vocabs.get(name))
            else:
                row[name] = [_raw_cat(x, name in text, enc.vocabs.get(name)) for x in _raw_list(v, name)]
        rows.append(row)
    surfaces = (table.column(surface_col).to_pylist() if surface_col else [enc.surfaces[0] if enc.surfaces
                                                                            else 0])
    return rows, [str(x) for x in surfaces] if surface_col else surfaces, {}


def _read_source_head(files: list[Path], limit: int, columns: list[str]) -> Any:
    """The first ``limit`` rows of the first readable source file (Parquet typed, CSV/TSV as text)."""
    import pyarrow.csv as pcsv

    for f in files:
        if not f.is_file():
            continue
        name = f.name.lower()
        try:
            if name.endswith(".parquet"):
                t = pq.ParquetFile(f).read_row_group(0, columns=columns)
            else:
                delim = "\t" if ".tsv" in name else ","
                t = pcsv.read_csv(f, parse_options=pcsv.ParseOptions(delimiter=delim),
                                  convert_options=pcsv.ConvertOptions(
                                      include_columns=columns, strings_can_be_null=False,
                                      column_types={c: pa.string() for c in columns}))
        except (OSError, pa.ArrowException, KeyError):
            continue
        return t.slice(0, limit)
    return None


def _raw_cat(v: Any, as_text: bool, vocab: Any) -> Any:
    """A categorical source value as a client sends it: text for a column the source held as text (or a
    string vocabulary), else the raw int."""
    if v is None or v == "":
        return ""
    if as_text or vocab is None or vocab.values is None or pa.types.is_string(vocab.values.type):
        return str(v)
    return int(v)


def _raw_list(v: Any, name: str) -> list[Any]:
    """A multi-valued source cell (a Parquet list; the importer reads no lists from CSV text)."""
    if v is None:
        return []
    if not isinstance(v, list):
        raise UsageError(f"--data: source column {name!r} is multi-valued but not a list "
                         f"({type(v).__name__})")
    return v


@dataclass(frozen=True)
class SharedFeatures:
    """Features each request sends once, in its context, with the values of its first candidate row, and
    not in its candidates (``--context``): the shape of a ranking request, one user and N ads, where the
    pool's rows each carry their own user."""

    names: tuple[str, ...]


# (candidate rows, their surfaces, the context every request sends: fixed values, or SharedFeatures)
Pool = tuple[list[dict[str, Any]], list[Any], dict[str, Any] | SharedFeatures]


def make_request(pool: list[dict[str, Any]], surfaces: list[Any], context: dict[str, Any] | SharedFeatures,
                 n: int, i: int, body_format: str = "json") -> bytes:
    """Request ``i`` of ``n`` candidates as a JSON or an Arrow IPC body (see serve/arrow_io.py)."""
    start = (i * n) % len(pool)
    cands = [pool[(start + k) % len(pool)] for k in range(n)]
    if isinstance(context, SharedFeatures):
        shared = set(context.names)
        context = {k: cands[0][k] for k in context.names}
        cands = [{k: v for k, v in c.items() if k not in shared} for c in cands]
    req: dict[str, Any] = {"surface": surfaces[i % len(surfaces)], "candidates": cands}
    if context:
        req["context"] = context
    return arrow_io.encode_request(req) if body_format == "arrow" else json.dumps(req).encode()


# --------------------------------------------------------------------------- the server process
class ServerProcess:
    """``opengem serve`` in a child process; its stderr is drained into :attr:`log` (never blocks it)."""

    def __init__(self, cmd: list[str], threads: int | None) -> None:
        env = dict(os.environ)
        if threads:
            env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env=env)
        self.log: list[str] = []
        self._port: int | None = None
        self._ready = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip())
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                self._port = int(m.group(1))
                self._ready.set()
        self._ready.set()

    def wait_ready(self, timeout: float = 600.0) -> int:
        self._ready.wait(timeout)
        deadline = time.monotonic() + 60
        while self._port is not None and time.monotonic() < deadline:
            try:
                if http_get(self._port, "/healthz")[0] == 200:
                    return self._port
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise UsageError("opengem serve did not start: " + " | ".join(self.log[-5:]))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


def serve_command(model: Path, backend: str, extra: list[str]) -> list[str]:
    """The server under test: ``opengem serve`` on a free port (the tests pass a fake model's instead)."""
    return [sys.executable, "-m", "opengem.cli", "serve", "--model", str(model), "--backend", backend,
            "--port", "0", *extra]


def http_get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


# --------------------------------------------------------------------------- load
def load_cell(port: int, bodies: list[bytes], clients: int, max_requests: int, duration_s: float,
              stop: threading.Event | None = None, warmup: int = WARMUP_PER_CLIENT, spin: bool = False
              ) -> tuple[list[float], int, float, list[str]]:
    """Closed-loop clients until ``max_requests`` are answered, ``duration_s`` passes or ``stop`` is set
    (:func:`opengem.bench.load_client.run_load`: one thread, non-blocking sockets; ``spin`` only when the
    clients have a CPU of their own).

    Returns (latencies in s of the successful requests, errors, wall seconds, a few error texts). Warm-up
    requests are not timed, but a failed one counts as an error like any other."""
    r = run_load(port, bodies, clients, max_requests, duration_s, stop=stop, warmup=warmup, spin=spin)
    return r.latencies, r.errors, r.seconds, r.samples


def summarize(backend: str, n: int, clients: int, lat: list[float], errors: int, seconds: float,
              samples: list[str], phase: str = "steady") -> CellResult:
    ms = np.asarray(lat) * 1e3 if lat else np.asarray([float("nan")])
    p50, p95, p99 = (float(np.percentile(ms, q)) for q in (50, 95, 99))
    return CellResult(backend, n, clients, len(lat) + errors, errors, seconds,
                      len(lat) / seconds if seconds > 0 else 0.0, p50, p95, p99, phase, samples)


# --------------------------------------------------------------------------- swap phase
EXPORT_FORMAT = "opengem-export"  # an export folder's manifest.json says so (serve/artifact.py)


def swap_sources(model: Path) -> list[Path]:
    """What the swap phase publishes in turn: the run's versions, else the run folder itself.

    An export folder cannot be published as a version: its own manifest.json (the artifact's digests)
    is where an online version's manifest goes. Raises UsageError saying so."""
    sources = [p for _, p in published_versions(model)]
    if sources:
        return sources
    manifest = model / MANIFEST
    if manifest.is_file() and EXPORT_FORMAT in manifest.read_text(errors="replace"):
        raise UsageError(f"--model {model} is an export folder: the swap phase publishes run folders as "
                         "versions; give a run folder, or --swap-versions 0")
    return [model]


def scratch_run(model: Path, root: Path) -> tuple[Path, list[Path]]:
    """A run folder with v0001 = the first source; the sources to cycle through."""
    sources = swap_sources(model)
    run = root / "swap-run"
    if sources[0] != model and (model / "config.toml").is_file():
        # an online run's versions are checkpoints of the model its config.toml describes: without it,
        # no published version loaded and the swap phase failed
        run.mkdir(parents=True, exist_ok=True)
        shutil.copy2(model / "config.toml", run / "config.toml")
    _publish(run, 1, sources[0])
    return run, sources


def _publish(run: Path, number: int, source: Path) -> None:
    """Copy ``source`` to versions/vNNNN (not its own versions, lock or benchmark files), manifest last
    (what makes it published)."""
    d = run / VERSIONS / f"v{number:04d}"
    shutil.copytree(source, d, ignore=shutil.ignore_patterns(MANIFEST, ".lock", VERSIONS, "serve_bench.json",
                                                             "report.html"))
    manifest = {}
    if (source / MANIFEST).is_file():
        manifest = json.loads((source / MANIFEST).read_text())
    manifest.update(version=number, trained_through_ts=int(manifest.get("trained_through_ts", 0)) + number)
    (d / MANIFEST).write_text(json.dumps(manifest))


def swap_cell(port: int, run: Path, sources: list[Path], bodies: list[bytes], clients: int, versions: int,
              timeout_s: float, spin: bool = False
              ) -> tuple[tuple[list[float], int, float, list[str]], list[str]]:
    """Load the server while ``versions`` new versions are published one by one and swapped in (each
    given ``timeout_s`` to be swapped in or refused).

    Returns load_cell's result and, per published version, the version served after it (or why it was
    refused)."""
    result: list[tuple[list[float], int, float, list[str]]] = []
    stop = threading.Event()
    t = threading.Thread(target=lambda: result.append(load_cell(port, bodies, clients, 10**12, 10**9, stop,
                                                                spin=spin)), daemon=True)
    t.start()
    swapped: list[str] = []
    time.sleep(0.5)  # under load before the first swap
    for k in range(versions):
        number = 2 + k
        _publish(run, number, sources[(k + 1) % len(sources)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            h = json.loads(http_get(port, "/healthz")[1])
            if h.get("swaps", 0) >= k + 1:
                swapped.append(str(h.get("version")))
                break
            if str(number) in h.get("refused_versions", {}):
                swapped.append(f"refused v{number:04d}: {h['refused_versions'][str(number)]}")
                break
            time.sleep(0.05)
        time.sleep(0.3)  # serve the new version a while before the next
    stop.set()
    t.join()
    return result[0], swapped


# --------------------------------------------------------------------------- the benchmark
@dataclass
class SwapPlan:
    """The swap phase: ``versions`` copies of ``model`` (a run) published under load, per backend."""

    model: Path
    backends: list[str]
    versions: int = 5
    candidates: int = 64
    clients: int = 4


def run_serve_bench(model: Path, backends: list[str], candidates: list[int], clients: list[int],
                    max_requests: int, duration_s: float, pool: Pool,
                    swap: SwapPlan | None = None, server_args: list[str] | None = None,
                    threads: int | None = 1,
                    server_cmd: Callable[[Path, str, list[str]], list[str]] = serve_command,
                    body_format: str = "json", pin: bool = True) -> dict[str, Any]:
    """Every (backend, candidates, clients) cell against ``model``, then the swap phase of ``swap``.

    ``pin`` (with two or more CPUs): each server runs on one CPU (``opengem serve --cpus``) and this
    process, whose threads are the clients, on the others, so that the load generator never takes the
    server's core (they shared both cores before, and the server's latency included the clients' work)."""
    rows, surfaces, context = pool
    most = max(candidates + [swap.candidates if swap else 1])
    extra = ["--max-candidates", str(most), *(server_args or [])]
    before = available_cpus()
    split = split_cpus(before) if pin else None
    if split is not None:
        extra += ["--cpus", ",".join(map(str, split[0]))]
    try:
        if split is not None:
            os.sched_setaffinity(0, split[1])
        # the clients spin (never let their vCPU halt: see load_client) only on CPUs of their own
        result = _run_grid(model, backends, candidates, clients, max_requests, duration_s, pool, swap, extra,
                           threads, server_cmd, body_format, spin=split is not None)
    finally:
        if split is not None:
            os.sched_setaffinity(0, before)
    result["pinning"] = ({"server_cpus": split[0], "client_cpus": split[1]} if split is not None
                         else None)
    return result


def _run_grid(model: Path, backends: list[str], candidates: list[int], clients: list[int], max_requests: int,
              duration_s: float, pool: Pool,
              swap: SwapPlan | None, extra: list[str], threads: int | None,
              server_cmd: Callable[[Path, str, list[str]], list[str]], body_format: str,
              spin: bool = False) -> dict[str, Any]:
    rows, surfaces, context = pool
    if swap is not None:
        swap_sources(swap.model)  # refuse an export folder before any measurement, not after
    cells: list[CellResult] = []
    swaps: list[dict[str, Any]] = []
    load_before = load_average()
    version = None
    for backend in backends:
        server = ServerProcess(server_cmd(model, backend, extra), threads)
        try:
            port = server.wait_ready()
            version = json.loads(http_get(port, "/healthz")[1]).get("version")
            for n in candidates:
                bodies = [make_request(rows, surfaces, context, n, i, body_format) for i in range(32)]
                for c in clients:
                    lat, errs, secs, samples = load_cell(port, bodies, c, max_requests, duration_s, spin=spin)
                    cells.append(summarize(backend, n, c, lat, errs, secs, samples))
                    print(_row(cells[-1]), file=sys.stderr, flush=True)
        finally:
            server.stop()
    for backend in swap.backends if swap is not None else []:
        swaps.append(_swap_phase(server_cmd(swap.model, backend, extra), swap.model, threads, rows, surfaces,
                                 context, swap.versions, swap.candidates, swap.clients, cells, spin))
    return {"model": str(model), "served_version": version, "swap_model": str(swap.model) if swap else None,
            "backends": backends, "body_format": body_format, "max_requests": max_requests,
            "duration_s": duration_s,
            "client": "one thread, non-blocking sockets" + (", spinning" if spin else ""),
            "server_threads": threads, "load_average_before": load_before,
            "load_average_after": load_average(),
            "cells": [asdict(c) for c in cells], "swaps": swaps,
            "command": " ".join(["opengem", *sys.argv[1:]])}


def _swap_phase(cmd: list[str], model: Path, threads: int | None, rows: list[dict[str, Any]],
                surfaces: list[Any], context: dict[str, Any] | SharedFeatures, versions: int, n: int,
                clients: int, cells: list[CellResult], spin: bool = False) -> dict[str, Any]:
    """``cmd`` serves ``model``: the same command serves a scratch run of its versions instead."""
    backend = cmd[cmd.index("--backend") + 1] if "--backend" in cmd else "?"
    with tempfile.TemporaryDirectory(prefix="opengem-swap-") as tmp:
        run, sources = scratch_run(model, Path(tmp))
        cmd = [str(run) if a == str(model) else a for a in cmd] + ["--poll-s", "0.2"]
        server = ServerProcess(cmd, threads)
        try:
            port = server.wait_ready()
            bodies = [make_request(rows, surfaces, context, n, i) for i in range(32)]
            (lat, errs, secs, samples), swapped = swap_cell(port, run, sources, bodies, clients, versions,
                                                            600, spin)
        finally:
            code = server.stop()
    cells.append(summarize(backend, n, clients, lat, errs, secs, samples, phase="swap"))
    print(_row(cells[-1]), file=sys.stderr, flush=True)
    return {"backend": backend, "versions_published": versions, "swapped_to": swapped,
            "requests": cells[-1].requests, "errors": errs, "server_exit": code}


# --------------------------------------------------------------------------- in-process stages
def _timed(fn: Callable[[], Any], reps: int) -> dict[str, float]:
    """p50/p99 of ``fn`` in ms, wall clock and this thread's CPU time (the CPU time is what a shared,
    overloaded machine inflates least: it leaves out the time other processes held the core)."""
    for _ in range(min(5, reps)):
        fn()
    wall, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - t0)
    w, c = np.asarray(wall) * 1e3, np.asarray(cpu) * 1e3
    return {"wall_p50_ms": float(np.percentile(w, 50)), "wall_p99_ms": float(np.percentile(w, 99)),
            "cpu_p50_ms": float(np.percentile(c, 50)), "cpu_p99_ms": float(np.percentile(c, 99))}


def in_process_stages(model: Path, backends: list[str], candidates: list[int], merged: int, reps: int,
                      pool: Pool) -> dict[str, Any]:
    """Each stage of a request timed inside one process, one thread (torch threads 1): the body decode
    (stdlib json, orjson, Arrow), the request -> Batch encoding (JSON objects, Arrow table), the forward
    pass, ``score_many`` of one request and of ``merged`` requests at once (what dynamic batching runs
    under load), and the reply encode. No HTTP, no other thread: the floor a server can reach."""
    import torch

    from opengem.serve import json_codec
    from opengem.serve.predictor import Predictor
    from opengem.serve.runtime import freeze_heap

    torch.set_num_threads(1)
    rows, surfaces, context = pool
    out: dict[str, Any] = {"model": str(model), "reps": reps, "merged": merged, "json": json_codec.BACKEND,
                           "load_average_before": load_average(), "stages": []}
    for backend in backends:
        p = Predictor.load(model, backend)
        freeze_heap()  # as `opengem serve` does after loading: no full collection the server would not pay
        for n in candidates:
            reqs = [json.loads(make_request(rows, surfaces, context, n, i)) for i in range(merged)]
            stages = _stage_fns(p, reqs)
            for name, fn in stages.items():
                few = max(5, reps // merged) if str(merged) in name.split()[1:2] else reps
                out["stages"].append({"backend": backend, "candidates": n, "stage": name, **_timed(fn, few)})
                print(_stage_row(out["stages"][-1]), file=sys.stderr, flush=True)
    out["load_average_after"] = load_average()
    out["command"] = " ".join(["opengem", *sys.argv[1:]])
    return out


def _stage_fns(p: Any, reqs: list[dict[str, Any]]) -> dict[str, Callable[[], Any]]:
    """The stages :func:`in_process_stages` times, on one Predictor and ``len(reqs)`` requests."""
    from opengem.serve import json_codec

    m = len(reqs)
    body = json.dumps(reqs[0]).encode()
    arrow_body = arrow_io.encode_request(reqs[0])
    tables = [arrow_io.decode_request(arrow_io.encode_request(r), tables=True) for r in reqs]
    batch, _ = p.encode(reqs[:1])
    big, _ = p.encode(reqs)
    reply = p.score(reqs[0])
    return {
        "decode json (stdlib)": lambda: json.loads(body),
        f"decode json ({json_codec.BACKEND})": lambda: json_codec.loads(body),
        "decode arrow": lambda: arrow_io.decode_request(arrow_body, tables=True),
        "encode 1 request (json objects)": lambda: p.encode(reqs[:1]),
        "encode 1 request (arrow table)": lambda: p.encode(tables[:1]),
        "forward 1 request": lambda: p.logits(batch),
        "score_many 1 request (json objects)": lambda: p.score_many(reqs[:1]),
        f"encode {m} requests (json objects)": lambda: p.encode(reqs),
        f"encode {m} requests (arrow tables)": lambda: p.encode(tables),
        f"forward {m} requests": lambda: p.logits(big),
        f"score_many {m} requests (json objects)": lambda: p.score_many(reqs),
        f"score_many {m} requests (arrow tables)": lambda: p.score_many(tables),
        f"reply ({json_codec.BACKEND})": lambda: json_codec.dumps(reply),
    }


STAGE_HEAD = (f"{'backend':<8}{'cands':>6}  {'stage':<42}{'cpu p50':>9}{'cpu p99':>9}{'wall p50':>10}"
              f"{'wall p99':>10}")


def _stage_row(r: dict[str, Any]) -> str:
    return (f"{r['backend']:<8}{r['candidates']:>6}  {r['stage']:<42}{r['cpu_p50_ms']:>9.3f}"
            f"{r['cpu_p99_ms']:>9.3f}{r['wall_p50_ms']:>10.3f}{r['wall_p99_ms']:>10.3f}")


def format_stages(result: dict[str, Any]) -> str:
    lines = [f"in-process stages (ms; one thread, torch threads 1), model {result['model']}, "
             f"{result['reps']} reps, load average {result['load_average_before']} -> "
             f"{result['load_average_after']}",
             STAGE_HEAD, "-" * len(STAGE_HEAD)]
    return "\n".join(lines + [_stage_row(r) for r in result["stages"]] + merged_overheads(result))


def merged_overheads(result: dict[str, Any]) -> list[str]:
    """E per backend and size: ``score_many`` of the merged Arrow requests minus their forward pass (CPU
    p50s), the per-forward-pass work that dilutes a faster backend's advantage under load (issue 16:
    AOTI reaches 2x eager's requests/s only when E is small beside the forward passes)."""
    cpu = {(r["backend"], r["candidates"], r["stage"]): r["cpu_p50_ms"] for r in result["stages"]}
    m = result.get("merged")
    out = []
    for (backend, n, stage), score in cpu.items():
        forward = cpu.get((backend, n, f"forward {m} requests"))
        if stage == f"score_many {m} requests (arrow tables)" and forward is not None:
            out.append(f"{backend} {n} cands: E = score_many - forward of {m} Arrow requests = "
                       f"{score - forward:.3f} ms CPU (forward {forward:.3f})")
    return out


# --------------------------------------------------------------------------- table
HEAD = (f"{'backend':<8}{'phase':<7}{'cands':>6}{'clients':>8}{'requests':>9}{'errors':>7}{'req/s':>9}"
        f"{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}")


def _row(c: CellResult) -> str:
    def ms(x: float | None) -> str:  # no answered request: no latency (NaN here, null in the JSON)
        return f"{x:>9.2f}" if x is not None and x == x else f"{'-':>9}"

    return (f"{c.backend:<8}{c.phase:<7}{c.candidates:>6}{c.clients:>8}{c.requests:>9}{c.errors:>7}"
            f"{c.requests_per_s:>9.1f}{ms(c.p50_ms)}{ms(c.p95_ms)}{ms(c.p99_ms)}")


def format_table(result: dict[str, Any]) -> str:
    cells = [CellResult(**c) for c in result["cells"]]
    pinning = result.get("pinning")
    pins = (f"server on CPU {','.join(map(str, pinning['server_cpus']))}, clients on "
            f"{','.join(map(str, pinning['client_cpus']))}" if pinning else "not pinned")
    lines = [f"opengem serve on loopback, {result.get('body_format', 'json')} bodies, model "
             f"{result['model']} ({result.get('served_version')}), server "
             f"threads {result.get('server_threads')}, {pins}, <= {result['max_requests']} requests or "
             f"{result['duration_s']} s per cell, load average {result['load_average_before']} -> "
             f"{result['load_average_after']}", HEAD, "-" * len(HEAD)]
    lines += [_row(c) for c in cells]
    for s in result.get("swaps", []):
        lines.append(f"swap ({s['backend']}): {s['versions_published']} versions published, "
                     f"{len([v for v in s['swapped_to'] if not v.startswith('refused')])} swapped in, "
                     f"{s['requests']} requests, {s['errors']} errors, server exit {s['server_exit']}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line
def add_serve_arguments(sub: Any) -> None:
    """``opengem bench serve``'s parser, added to ``opengem bench``'s sub-commands."""
    s = sub.add_parser("serve", help="loopback load test of opengem serve: p50/p95/p99 latency and "
                       "requests/s per backend, candidates and clients, and during a hot swap")
    s.add_argument("--model", required=True, metavar="DIR|RUN", help="what opengem serve --model takes")
    s.add_argument("--data", default=None, help="dataset the model reads: one candidate per row")
    s.add_argument("--requests-file", default=None, metavar="FILE.json",
                   help="request objects whose candidates are pooled (instead of --data)")
    s.add_argument("--backends", default="eager,export,aoti", help="comma-separated (default all three)")
    s.add_argument("--candidates", default="1,64,512", help="candidates per request, comma-separated")
    s.add_argument("--clients", default="1,4,16", help="concurrent clients, comma-separated")
    s.add_argument("--requests", type=int, default=500, help="requests per cell at most")
    s.add_argument("--duration", type=float, default=10.0, help="seconds per cell at most")
    s.add_argument("--swap-versions", type=int, default=5, help="versions published under load (0: no swap)")
    s.add_argument("--swap-model", default=None, metavar="RUN",
                   help="run folder whose versions (or itself) the swap phase publishes (default: --model)")
    s.add_argument("--swap-backends", default=None, help="backends of the swap phase (default: --backends)")
    s.add_argument("--swap-candidates", type=int, default=64, help="candidates per request during the swap")
    s.add_argument("--swap-clients", type=int, default=4, help="clients during the swap")
    s.add_argument("--server-threads", type=int, default=1, help="OMP threads of the server (0: its default)")
    s.add_argument("--max-wait-us", type=int, default=None, help="passed to opengem serve")
    s.add_argument("--max-batch-candidates", type=int, default=None, help="passed to opengem serve")
    s.add_argument("--out", default=None, help="JSON file (default: MODEL/serve_bench.json for a run folder, "
                   "else ./serve_bench.json)")
    s.add_argument("--context", default="", metavar="FEATURES",
                   help="comma-separated features each request sends once in its context (the values of its "
                        "first candidate row) instead of in every candidate: one user and N ads")
    s.add_argument("--body", default="json", choices=("json", "arrow"),
                   help="request body format of the steady cells (the swap phase sends JSON)")
    s.add_argument("--no-pin", dest="pin", action="store_false",
                   help="do not pin (default with >= 2 CPUs: the server on one CPU, its clients on the "
                        "others)")
    s.add_argument("--no-gc-freeze", action="store_true", help="passed to opengem serve (to measure what the "
                   "frozen heap saves)")
    s.add_argument("--in-process", action="store_true",
                   help="no server: time each stage of a request inside this process instead (decode, "
                        "encode, forward, score_many of one and of --merged requests, reply)")
    s.add_argument("--merged", type=int, default=16, help="--in-process: requests per merged batch")
    s.add_argument("--json", action="store_true", help="print JSON instead of the table")


def _backends(flag: str, text: str) -> list[str]:
    backends = [b for b in text.split(",") if b]
    unknown = sorted(set(backends) - {"eager", "export", "aoti", "auto"})
    if unknown or not backends:
        raise UsageError(f"{flag}: from eager, export, aoti, auto; got {text!r}")
    return backends


def _int_list(flag: str, text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag}: comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise UsageError(f"{flag}: integers >= 1, got {text!r}")
    return values


def _with_shared_features(pool: Pool, text: str, requests_file: str | None) -> Pool:
    """The pool with ``--context FEATURES``: each request sends those features once (see SharedFeatures)."""
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    if requests_file:
        raise UsageError("--context takes its values from the rows of --data; a --requests-file brings "
                         "its own contexts")
    rows, surfaces, _ = pool
    unknown = [x for x in names if x not in rows[0]]
    if unknown or not names or len(set(names)) != len(names):
        raise UsageError(f"--context: comma-separated features of the candidate rows, each once "
                         f"({', '.join(rows[0])}); got {text!r}")
    return rows, surfaces, SharedFeatures(names)


def run_serve(args: argparse.Namespace) -> int:
    """``opengem bench serve``: run the grid, write the JSON, print the table."""
    backends = _backends("--backends", args.backends)
    if args.swap_backends is not None:
        _backends("--swap-backends", args.swap_backends)
    candidates = _int_list("--candidates", args.candidates)
    clients = _int_list("--clients", args.clients)
    for flag, v in (("--requests", args.requests), ("--swap-candidates", args.swap_candidates),
                    ("--swap-clients", args.swap_clients)):
        if v < 1:
            raise UsageError(f"{flag}: must be >= 1 (got {v})")
    if args.duration <= 0 or args.swap_versions < 0:
        raise UsageError("--duration must be > 0 and --swap-versions >= 0")
    model = Path(args.model)
    if not model.exists():
        raise UsageError(f"--model {model}: no such folder")
    pool = candidate_pool(args.data, args.requests_file, raw=takes_raw_values(model, args.data))
    if args.context:
        pool = _with_shared_features(pool, args.context, args.requests_file)
    if args.in_process:
        if args.merged < 1:
            raise UsageError(f"--merged: must be >= 1 (got {args.merged})")
        staged = in_process_stages(model, backends, candidates, args.merged, args.requests, pool)
        out = Path(args.out) if args.out else Path("serve_stages.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(staged, indent=2))
        print(json.dumps(staged, indent=2) if args.json else format_stages(staged))
        print(f"wrote {out}", file=sys.stderr)
        return 0
    server_args = []
    for flag, v in (("--max-wait-us", args.max_wait_us),
                    ("--max-batch-candidates", args.max_batch_candidates)):
        if v is not None:
            server_args += [flag, str(v)]
    if args.no_gc_freeze:
        server_args.append("--no-gc-freeze")
    swap = None
    if args.swap_versions > 0:
        swap_backends = [b for b in (args.swap_backends or args.backends).split(",") if b]
        swap = SwapPlan(Path(args.swap_model or args.model), swap_backends, args.swap_versions,
                        args.swap_candidates, args.swap_clients)
    result = run_serve_bench(model, backends, candidates, clients, args.requests, args.duration, pool, swap,
                             server_args, args.server_threads or None, body_format=args.body, pin=args.pin)
    out = Path(args.out) if args.out else (model / "serve_bench.json" if (model / "config.toml").is_file()
                                           else Path("serve_bench.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(json_safe(result), indent=2)  # a cell with no answered request has no latency: null
    out.write_text(text)
    print(text if args.json else format_table(result))
    print(f"wrote {out}", file=sys.stderr)
    dead = [c for c in result["cells"] if c["requests"] and c["errors"] == c["requests"]]
    if dead:  # a table of NaN is no benchmark: say why, and exit 1
        c = dead[0]
        raise TrainError(f"{len(dead)} cell(s) had every request fail, e.g. {c['backend']} {c['candidates']} "
                         f"candidates x {c['clients']} clients: {(c['error_samples'] or ['(no reply)'])[0]} "
                         f"(results in {out})")
    return 0

