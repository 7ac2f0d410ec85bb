"""Does the server's ``score`` stage cost more than the same work in-process? An interleaved A/B.

    .venv/bin/python benchmarks/serve_vm_score_ab.py --model DIR --data DATA [--backend aoti]
                                                     [--requests 200] [--candidates 512] [--out FILE.json]

Session 4's probe put the server's ``score`` stage (the model thread's ``score_many``) at about twice one
request's encode + forward measured in-process. Comparing separate runs on a shared machine cannot say
whether that is work the server adds (torch threads, GIL waits, cold caches, allocations) or time the
thread spent waiting for a core. Here one process serves HTTP (``ModelServer`` on one CPU, its model
thread scoring) and, between requests, scores the very same request on its main thread with the same
Predictor: request i over HTTP (a client process on another CPU), then request i in-process, and so on.
Each ``score_many`` is split into encode, forward and the rest (reply lists) and timed with the calling
thread's CPU time (``time.thread_time``), wall time, and its ``getrusage`` counts: voluntary context
switches (a wait, e.g. for the GIL), involuntary ones (preempted), minor page faults. Equal CPU on both
threads means the server adds nothing to the work; wall far above CPU means waiting for a core.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from opengem.bench.serve_bench import candidate_pool, make_request
from opengem.data.batch import Batch
from opengem.serve import arrow_io
from opengem.serve.predictor import Predictor
from opengem.serve.runtime import available_cpus, freeze_heap, split_cpus
from opengem.serve.server import ModelServer, ServeConfig

PARTS = ("encode", "forward", "rest", "total")
COUNTERS = ("cpu_ms", "wall_ms", "voluntary_switches", "involuntary_switches", "minor_faults")

CLIENT = """
import http.client, sys
bodies = [open(f, "rb").read() for f in sys.argv[2:]]
conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1].split("|")[0]))
headers = {"Content-Type": sys.argv[1].split("|")[1], "Accept": sys.argv[1].split("|")[1]}
for line in sys.stdin:
    conn.request("POST", "/predict", body=bodies[int(line) % len(bodies)], headers=headers)
    r = conn.getresponse()
    r.read()
    print(r.status, flush=True)
"""  # argv: "PORT|CONTENT-TYPE", then the body files


def _snapshot() -> np.ndarray:
    r = resource.getrusage(resource.RUSAGE_THREAD)
    return np.array([time.thread_time() * 1e3, time.perf_counter() * 1e3, r.ru_nvcsw, r.ru_nivcsw,
                     r.ru_minflt])


class TimedPredictor(Predictor):
    """A Predictor whose every ``score_many`` records, per part, the calling thread's counters."""

    records: list[dict[str, Any]]

    def score_many(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self._marks = [_snapshot()]
        out = super().score_many(requests)
        end = _snapshot()
        enc, fwd = self._marks[1] - self._marks[0], self._marks[2] - self._marks[1]
        total = end - self._marks[0]
        self.records.append({"thread": threading.current_thread().name, "encode": enc, "forward": fwd,
                             "rest": total - enc - fwd, "total": total})
        return out

    def encode(self, requests: list[dict[str, Any]]) -> tuple[Batch, list[int]]:
        out = super().encode(requests)
        self._marks.append(_snapshot())
        return out

    def logits(self, batch: Batch) -> torch.Tensor:
        out = super().logits(batch)
        self._marks.append(_snapshot())
        return out


def summarize(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per part: CPU and wall p50 (ms), wall p99, and the mean of each counter per request."""
    out = {}
    for part in PARTS:
        a = np.array([r[part] for r in records])
        out[part] = {"cpu_p50_ms": float(np.median(a[:, 0])), "wall_p50_ms": float(np.median(a[:, 1])),
                     "wall_p99_ms": float(np.percentile(a[:, 1], 99)),
                     **{f"mean_{k}": float(a[:, i].mean()) for i, k in enumerate(COUNTERS)}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="export folder (opengem export)")
    ap.add_argument("--data", required=True, help="dataset the request rows come from")
    ap.add_argument("--backend", default="aoti")
    ap.add_argument("--candidates", type=int, default=512)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--out", help="write the numbers as JSON here")
    a = ap.parse_args()
    split = split_cpus(available_cpus())
    if split is None:
        raise SystemExit("serve_vm_score_ab: needs two CPUs (the server's and the client's)")
    os.sched_setaffinity(0, split[0])
    torch.set_num_threads(1)
    p = TimedPredictor.load(a.model, a.backend, max_candidates=a.candidates)
    p.records = []
    rows, surfaces, context = candidate_pool(a.data, None)
    bodies = [make_request(rows, surfaces, context, a.candidates, i, "arrow") for i in range(32)]
    server = ModelServer(p, ServeConfig(port=0, max_candidates=a.candidates))
    port = server.start_in_thread()
    freeze_heap()  # as `opengem serve` does after loading
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="serve-ab-") as tmp:
        files = []
        for i, b in enumerate(bodies):
            files.append(Path(tmp) / f"{i}.arrow")
            files[-1].write_bytes(b)
        cmd = ["taskset", "-c", ",".join(map(str, split[1])), sys.executable, "-c", CLIENT,
               f"{port}|{arrow_io.ARROW_STREAM}", *map(str, files)]
        client = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert client.stdin is not None and client.stdout is not None
        try:
            for i in range(a.warmup + a.requests):
                client.stdin.write(f"{i}\n")
                client.stdin.flush()
                status = client.stdout.readline().strip()
                if status != "200":
                    raise SystemExit(f"serve_vm_score_ab: HTTP {status or 'no answer'} for request {i}")
                p.score_many([arrow_io.decode_request(bodies[i % len(bodies)], tables=True)])
        finally:
            client.stdin.close()
            client.wait(30)
            server.stop()
    by_thread = {"server model thread": "opengem-batcher", "in-process main thread": "MainThread"}
    result = {name: summarize([r for r in p.records if r["thread"] == t][a.warmup:])
              for name, t in by_thread.items()}
    out = {"model": a.model, "backend": a.backend, "candidates": a.candidates, "requests": a.requests,
           "load_average_before": load_before, "load_average_after": os.getloadavg(),
           "server_cpus": split[0], "client_cpus": split[1], "command": " ".join(sys.argv), "result": result}
    loads = [tuple(round(x, 2) for x in la) for la in (load_before, out["load_average_after"])]
    print(f"{a.requests} requests of {a.candidates} Arrow candidates, {a.backend}, interleaved; load average "
          f"{loads[0]} -> {loads[1]}")
    for name, parts in result.items():
        print(name)
        for part, x in parts.items():
            print(f"  {part:<8} CPU p50 {x['cpu_p50_ms']:6.3f} | wall p50 {x['wall_p50_ms']:6.3f} p99 "
                  f"{x['wall_p99_ms']:7.3f} | per request: voluntary switches "
                  f"{x['mean_voluntary_switches']:.2f}, involuntary {x['mean_involuntary_switches']:.2f}, "
                  f"minor faults {x['mean_minor_faults']:.1f}")
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
