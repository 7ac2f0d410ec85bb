import os
import time

import numpy as np
import torch

from opengem.bench.serve_bench import candidate_pool, make_request
from opengem.serve import Predictor, arrow_io

torch.set_num_threads(1)
os.sched_setaffinity(0, [0])

pool, surfaces, ctx = candidate_pool("/work/serve_s3/work/vmdata", None)
bodies = [make_request(pool, surfaces, ctx, 512, i, "arrow") for i in range(16)]
reqs = [arrow_io.decode_request(b, tables=True) for b in bodies]
P = {
    "base": Predictor.load("/work/serve_s3/work/vm-export", backend="aoti", aoti_chunk_rows=0),
    "frz": Predictor.load("/work/s7/vm-export-frz", backend="aoti", aoti_chunk_rows=0),
    "frz_chunk": Predictor.load("/work/s7/vm-export-frz", backend="aoti"),
    "eager": Predictor.load("/work/s7/vm-export-frz", backend="eager"),
}
for k in (1, 4, 8, 16):
    b, _ = P["base"].encode(reqs[:k])
    xs = {n: [] for n in P}
    for _ in range(40):
        for n, q in P.items():
            c = time.thread_time()
            q.logits(b)
            xs[n].append(time.thread_time() - c)
    print(
        f"rows {512 * k}: "
        + "  ".join(f"{n} {np.median(v[5:]) * 1e3 / k:.3f}" for n, v in xs.items())
        + "  ms per 512",
        flush=True,
    )
