"""Encode of ranking requests (one user's context, N ads) before and after session 54, interleaved.

    python ab.py MODEL_DIR DATA_DIR BEFORE_ENCODE_PY [--reps 200] > ab.txt

BEFORE_ENCODE_PY: the encode.py before the change (``git show f8f9091:src/opengem/serve/encode.py``), loaded
as a module beside the current one; both RequestEncoders encode the same requests of 512 candidates built from
the first rows of DATA_DIR as `opengem bench serve --context` builds them (the user's features once, from the
request's first row), alone and 16 merged, Arrow tables and JSON objects; and, for scale, the same rows with
every feature in every candidate (no context). Arms alternate call by call; thread CPU time, median.
"""

import argparse
import importlib.util
import os
import statistics
import sys
import time

from opengem.bench.serve_bench import SharedFeatures, candidate_pool, make_request
from opengem.serve import arrow_io
from opengem.serve.predictor import Predictor

USER = ("user_id", "user_interests", "hist__item", "hist__action")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("data")
    ap.add_argument("before")
    ap.add_argument("--reps", type=int, default=200)
    a = ap.parse_args()
    spec = importlib.util.spec_from_file_location("encode_before", a.before)
    before = importlib.util.module_from_spec(spec)
    sys.modules["encode_before"] = before  # dataclasses look their module up
    spec.loader.exec_module(before)
    p = Predictor.load(a.model, backend="eager")
    encoders = {"before": before.RequestEncoder(p.schema, p.encoder.max_candidates, p.artifact.encoding),
                "after": p.encoder}
    rows, surfaces, _ = candidate_pool(a.data, None, limit=8192)
    shared = SharedFeatures(USER)
    cases = {}
    for name, ctx in (("context", shared), ("no context", {})):
        bodies = [make_request(rows, surfaces, ctx, 512, i, "arrow") for i in range(16)]
        tables = [arrow_io.decode_request(b, tables=True) for b in bodies]
        objects = [arrow_io.decode_request(b, tables=False) for b in bodies]
        cases[f"{name}, 1 Arrow request"] = lambda k, t=tables: [t[k % 16]]
        cases[f"{name}, 16 Arrow requests"] = lambda k, t=tables: t
        cases[f"{name}, 1 JSON request"] = lambda k, o=objects: [o[k % 16]]
        cases[f"{name}, 16 JSON requests"] = lambda k, o=objects: o
        print(f"{name}: Arrow body {len(bodies[0]):,} bytes", flush=True)
    print(f"load average before {os.getloadavg()}")
    print(f"{'case':<32}{'before ms':>11}{'after ms':>10}{'after/before':>14}")
    for case, reqs in cases.items():
        times = {arm: [] for arm in encoders}
        reps = a.reps if case.split(", ")[1].startswith("1 ") else max(20, a.reps // 8)
        for k in range(reps + 5):
            for arm, enc in encoders.items():
                t = time.thread_time()
                batch, _ = enc.batch(reqs(k))
                if k >= 5:
                    times[arm].append((time.thread_time() - t) * 1e3)
        b, f = statistics.median(times["before"]), statistics.median(times["after"])
        print(f"{case:<32}{b:>11.3f}{f:>10.3f}{f / b:>14.2f}", flush=True)
    print(f"load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
