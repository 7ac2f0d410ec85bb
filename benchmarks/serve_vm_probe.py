"""Where one client's request time goes: the real server against an echo app on the same HTTP stack.

    .venv/bin/python benchmarks/serve_vm_probe.py --model DIR --data DATA [--backend aoti] [--requests 300]
                                                  [--candidates 512] [--body arrow|json] [--out FILE.json]

Issue 16's one-client target (p99 < 5 ms at 512 candidates on one core) is a wall-clock number, but on a
shared machine wall clocks mostly measure the other processes. This probe measures what each side
spends instead, with one keep-alive client (``opengem.bench.load_client``: bodies built before timing,
spinning on its socket so that its own vCPU never halts; ``--client block`` lets it sleep) on its own CPU:

* ``echo``: a Starlette route on the server's uvicorn stack (``server.http_stack``: httptools + uvloop when
  installed) that reads the body and answers the real server's reply bytes: the floor of HTTP, loopback
  and the client, with no model;
* ``serve``: ``opengem serve --cpus 0`` with the model.

Per server: the client's wall p50/p90/p99, the client thread's CPU per request (``time.thread_time``), the
server process's CPU per request (``/proc/PID/stat``, user + system, over the timed requests) and, for
the real server, the mean of each stage of ``opengem_request_stage_seconds`` (read, decode, queue,
score, reply) over the same requests, and the model thread's wall and own CPU time per batch (a score
stage far above its CPU is the thread waiting for a core, not computing), and the garbage collections
that ran during them (count and total pause). ``/proc`` counts in clock ticks (10 ms): time a few
hundred requests, not a handful. Server CPU minus the echo's is the model's
path; wall minus both CPUs is waiting (the scheduler, other processes): compare CPUs across runs, and
walls only on a quiet machine. ``benchmarks/serve_vm.sh`` runs it after the grid.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import socket
import sys
import time
from pathlib import Path

import numpy as np

from opengem.bench.load_client import run_load
from opengem.bench.serve_bench import ServerProcess, candidate_pool, http_get, make_request
from opengem.serve import arrow_io
from opengem.serve.runtime import available_cpus, split_cpus

STAGES = ("read", "decode", "queue", "score", "reply")
BATCH = ("batch_wall", "batch_cpu")  # per score_many call: the model thread's wall time and its own CPU


def echo_server(reply_file: str, ctype: str, cpus: str) -> None:
    """The echo app (run as a child process): read the body, answer ``reply_file``'s bytes."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from opengem.serve.server import http_stack

    if cpus:
        os.sched_setaffinity(0, [int(c) for c in cpus.split(",")])
    reply = Path(reply_file).read_bytes()

    async def predict(request: Request) -> Response:
        body = [chunk async for chunk in request.stream()]
        del body
        return Response(reply, media_type=ctype)

    async def healthz(request: Request) -> Response:
        return Response(b"{}", media_type="application/json")

    app = Starlette(routes=[Route("/predict", predict, methods=["POST"]), Route("/healthz", healthz)])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    http, loop = http_stack()
    print(f"listening on http://127.0.0.1:{sock.getsockname()[1]} ({http}, {loop})", file=sys.stderr,
          flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, http=http, loop=loop)
                   ).run(sockets=[sock])


def _process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stage_sums(port: int) -> dict[tuple[str, str], float]:
    """Sums and counts of the per-stage histograms, and of the model thread's wall and CPU time per batch
    (``opengem_batch_seconds`` / ``opengem_batch_cpu_seconds``, keyed ``batch_wall`` / ``batch_cpu``)."""
    text = http_get(port, "/metrics")[1].decode()
    out = {(m.group(2), m.group(1)): float(m.group(3)) for m in re.finditer(
        r'opengem_request_stage_seconds_(sum|count)\{stage="(\w+)"\} ([0-9.e+-]+)', text)}
    for m in re.finditer(r'opengem_gc_pause_seconds_(sum|count)\{generation="(\d)"\} ([0-9.e+-]+)', text):
        out[("gc", m.group(1))] = out.get(("gc", m.group(1)), 0.0) + float(m.group(3))
    for name, key in (("opengem_batch_seconds", "batch_wall"), ("opengem_batch_cpu_seconds", "batch_cpu")):
        for part in ("sum", "count"):
            m = re.search(rf"^{name}_{part} ([0-9.e+-]+)$", text, re.M)
            if m:
                out[(key, part)] = float(m.group(1))
    return out


def probe(cmd: list[str], bodies: list[bytes], headers: dict[str, str], requests: int,
          client_cpus: list[int] | None, stages: bool, spin: bool) -> tuple[dict[str, float], bytes]:
    """Time ``requests`` sequential requests against the server ``cmd`` starts; returns numbers, a reply."""
    server = ServerProcess(cmd, 1)
    before = os.sched_getaffinity(0)
    try:
        port = server.wait_ready()
        if client_cpus:
            os.sched_setaffinity(0, client_cpus)
        conn = http.client.HTTPConnection("127.0.0.1", port)
        reply = b""
        for i in range(20):  # warm-up, untimed
            conn.request("POST", "/predict", body=bodies[i % len(bodies)], headers=headers)
            r = conn.getresponse()
            reply = r.read()
            if r.status != 200:
                raise SystemExit(f"serve_vm_probe: {r.status} {reply[:300]!r}")
        conn.close()
        s0 = _stage_sums(port) if stages else {}
        c0 = _process_cpu_s(server.proc.pid)
        k0 = time.thread_time()
        r = run_load(port, bodies, 1, requests, 1e9, warmup=0, spin=spin, accept=headers.get("Accept"))
        if r.errors or len(r.latencies) != requests:
            raise SystemExit(f"serve_vm_probe: {r.errors} failed requests: {r.samples}")
        cpu, wall = [(time.thread_time() - k0) / requests], r.latencies
        server_cpu = (_process_cpu_s(server.proc.pid) - c0) / requests
        s1 = _stage_sums(port) if stages else {}
    finally:
        os.sched_setaffinity(0, before)
        server.stop()
    w = np.asarray(wall) * 1e3
    out = {"wall_p50_ms": float(np.percentile(w, 50)), "wall_p90_ms": float(np.percentile(w, 90)),
           "wall_p99_ms": float(np.percentile(w, 99)), "client_cpu_ms": float(np.mean(cpu)) * 1e3,
           "server_cpu_ms": server_cpu * 1e3}
    if stages:  # garbage collections during the timed requests (the heap is frozen: expect few, short)
        out["gc_collections"] = s1.get(("gc", "count"), 0.0) - s0.get(("gc", "count"), 0.0)
        out["gc_ms"] = (s1.get(("gc", "sum"), 0.0) - s0.get(("gc", "sum"), 0.0)) * 1e3
    for st in (*STAGES, *BATCH) if stages else ():
        n = s1[(st, "count")] - s0.get((st, "count"), 0)
        out[f"{st}_ms"] = (s1[(st, "sum")] - s0.get((st, "sum"), 0)) / n * 1e3 if n else float("nan")
    return out, reply


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="export folder (opengem export)")
    ap.add_argument("--data", help="dataset the request rows come from")
    ap.add_argument("--backend", default="aoti")
    ap.add_argument("--candidates", type=int, default=512)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--body", choices=("arrow", "json"), default="arrow")
    ap.add_argument("--client", choices=("spin", "block"), default="spin",
                    help="spin: the client polls its socket and its vCPU never halts (the default, when it "
                         "has a CPU of its own); block: it sleeps in select while the server works, and its "
                         "vCPU's wake-up time is in the latencies")
    ap.add_argument("--out", help="write the numbers as JSON here")
    ap.add_argument("--echo-reply", help=argparse.SUPPRESS)  # child mode: the echo app
    ap.add_argument("--echo-ctype", help=argparse.SUPPRESS)
    ap.add_argument("--echo-cpus", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.echo_reply:
        return echo_server(a.echo_reply, a.echo_ctype, a.echo_cpus)
    if not (a.model and a.data):
        ap.error("--model and --data are required")
    rows, surfaces, context = candidate_pool(a.data, None)
    bodies = [make_request(rows, surfaces, context, a.candidates, i, a.body) for i in range(32)]
    ctype = arrow_io.ARROW_STREAM if a.body == "arrow" else "application/json"
    headers = {"Content-Type": ctype, "Accept": ctype}
    split = split_cpus(available_cpus())
    server_cpus, client_cpus = (split[0], split[1]) if split else ([], None)
    pin = ["--cpus", ",".join(map(str, server_cpus))] if server_cpus else []
    serve = [sys.executable, "-m", "opengem.cli", "serve", "--model", a.model, "--backend", a.backend,
             "--port", "0", "--max-candidates", str(a.candidates), *pin]
    load_before = os.getloadavg()
    results = {}
    spin = a.client == "spin" and client_cpus is not None
    results["serve"], reply = probe(serve, bodies, headers, a.requests, client_cpus, stages=True, spin=spin)
    reply_file = Path(a.out or "serve_vm_probe.json").with_suffix(".reply")
    reply_file.write_bytes(reply)
    echo = [sys.executable, __file__, "--echo-reply", str(reply_file), "--echo-ctype", ctype,
            "--echo-cpus", ",".join(map(str, server_cpus))]
    results["echo"], _ = probe(echo, bodies, headers, a.requests, client_cpus, stages=False, spin=spin)
    reply_file.unlink()
    out = {"model": a.model, "backend": a.backend, "candidates": a.candidates, "body": a.body,
           "requests": a.requests, "body_bytes": len(bodies[0]), "reply_bytes": len(reply),
           "server_cpus": server_cpus, "client_cpus": client_cpus, "client": "spin" if spin else "block",
           "load_average_before": load_before,
           "load_average_after": os.getloadavg(), "results": results}
    loads = [tuple(round(x, 2) for x in la) for la in (load_before, out["load_average_after"])]
    kind = "spinning" if spin else "blocking"
    print(f"one keep-alive client ({kind}), {a.requests} requests of {a.candidates} candidates, "
          f"{a.body} body ({len(bodies[0])} B) and reply ({len(reply)} B), {a.backend}; "
          f"load average {loads[0]} -> {loads[1]}")
    for name, r in results.items():
        line = (f"{name:<6} wall p50 {r['wall_p50_ms']:6.2f} p90 {r['wall_p90_ms']:6.2f} "
                f"p99 {r['wall_p99_ms']:6.2f} | CPU/request client {r['client_cpu_ms']:.3f} "
                f"server {r['server_cpu_ms']:.3f} ms")
        if "score_ms" in r:
            line += " | stages " + ", ".join(f"{st} {r[st + '_ms']:.3f}" for st in STAGES)
            line += (f" | model thread per batch: wall {r['batch_wall_ms']:.3f}, CPU {r['batch_cpu_ms']:.3f}"
                     f" | {r['gc_collections']:.0f} garbage collections, {r['gc_ms']:.2f} ms in all")
        print(line)
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
