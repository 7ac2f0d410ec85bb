"""Does a second core help the server? The model thread's forward pass beside a thread that only runs Python.

    .venv/bin/python benchmarks/serve_gil_probe.py --model DIR --data DATA [--backends aoti,eager]
                                                   [--requests 16] [--candidates 512] [--calls 50]

``opengem serve`` runs its model on one thread and its event loop (HTTP, body decoding, replies) on
another, in one process. With 16 clients the event loop has Python work queued all the time; whether a
second CPU lets it run beside the forward pass depends on the interpreter lock, not on the CPUs. This
probe gives the process two CPUs, starts a thread that counts in a Python loop (a stand-in for the event
loop), and times ``--calls`` forward passes of ``--requests`` merged requests on the main thread beside it.
It prints, per backend, the forward's time alone and beside the Python thread, and the Python thread's
progress during the forward passes as a share of its progress alone (1.0: the two ran in parallel).
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch

from opengem.bench.serve_bench import candidate_pool, make_request
from opengem.serve import arrow_io
from opengem.serve.predictor import Predictor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="export folder (opengem export)")
    ap.add_argument("--data", required=True, help="dataset the request rows come from")
    ap.add_argument("--backends", default="aoti,eager")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--candidates", type=int, default=512)
    ap.add_argument("--calls", type=int, default=50)
    a = ap.parse_args()
    torch.set_num_threads(1)
    cpus = sorted(os.sched_getaffinity(0))[:2]
    os.sched_setaffinity(0, cpus)
    rows, surfaces, context = candidate_pool(a.data, None)
    bodies = [make_request(rows, surfaces, context, a.candidates, i, "arrow") for i in range(a.requests)]
    reqs = [arrow_io.decode_request(b, tables=True) for b in bodies]
    print(f"CPUs {cpus}, load average {tuple(round(x, 2) for x in os.getloadavg())}, {a.requests} x "
          f"{a.candidates} candidates merged, {a.calls} forward passes")
    for backend in a.backends.split(","):
        p = Predictor.load(a.model, backend=backend)
        batch, _ = p.encode(reqs)
        for _ in range(3):
            p.logits(batch)
        t0 = time.perf_counter()
        for _ in range(a.calls):
            p.logits(batch)
        alone = (time.perf_counter() - t0) / a.calls
        stop, count = threading.Event(), [0]
        t = threading.Thread(target=_count_up, args=(stop, count))
        t.start()
        time.sleep(1.0)
        solo_rate = count[0] / 1.0
        count[0] = 0
        t0 = time.perf_counter()
        for _ in range(a.calls):
            p.logits(batch)
        beside = (time.perf_counter() - t0) / a.calls
        share = count[0] / (beside * a.calls) / solo_rate
        stop.set()
        t.join()
        print(f"{backend:<6} forward alone {alone * 1e3:8.2f} ms | beside a Python thread "
              f"{beside * 1e3:8.2f} ms | the Python thread ran at {share:.2f} of its solo rate meanwhile")


def _count_up(stop: threading.Event, count: list[int]) -> None:
    while not stop.is_set():
        count[0] += 1


if __name__ == "__main__":
    main()
