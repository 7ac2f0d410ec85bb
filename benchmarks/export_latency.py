"""Export cost, parity and single-request latency of eager vs torch.export vs AOTInductor (issue 16 part A).

    nice -n 10 .venv/bin/python benchmarks/export_latency.py [--model vm|gem] [--candidates 512] [--reps 50]
        [--backends eager,export,aoti] [--threads 1]

``vm``: the vertical model of configs/transfer.toml (a DLRM on the derived VM schema); ``gem``: the GEM of
configs/small.toml on its simulator schema. Weights are the model's initialisation (latency and parity
do not depend on training). Parity: max |logit - eager logit| over random batches of 1, 7 and 64 rows
(empty histories included). Latency of one request of ``--candidates`` candidates: ``Predictor.score``
(request encoding + forward + reply), the encoding alone, and the forward alone on the encoded batch;
median and p99 over ``--reps`` timed calls after 3 warm-up calls. Prints one JSON object; the machine is
shared, so it records the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import tomllib
import warnings
from pathlib import Path

import numpy as np
import torch

from opengem.config import from_dict
from opengem.data.random_batch import random_batch
from opengem.data.sim_config import SimConfig, sim_schema
from opengem.model.registry import ModelConfig, build_model
from opengem.serve.export import export_model
from opengem.serve.predictor import Predictor
from opengem.transfer.vertical import VMSchemaConfig, derive_vm_schema

ROOT = Path(__file__).resolve().parents[1]


def vm_model() -> tuple[torch.nn.Module, object, ModelConfig]:
    t = tomllib.loads((ROOT / "configs" / "transfer.toml").read_text())
    fm_schema = sim_schema(SimConfig.from_dict(t["data"]["sim"]))
    schema = derive_vm_schema(fm_schema, from_dict(VMSchemaConfig, t["vm"]["schema"]), name="vm")
    cfg = from_dict(ModelConfig, t["vm"]["model"])
    torch.manual_seed(0)
    return build_model(schema, cfg), schema, cfg


def gem_model() -> tuple[torch.nn.Module, object, ModelConfig]:
    t = tomllib.loads((ROOT / "configs" / "small.toml").read_text())
    schema = sim_schema(SimConfig.from_dict(t["data"].get("sim", {})))
    cfg = from_dict(ModelConfig, t["model"])
    torch.manual_seed(0)
    return build_model(schema, cfg), schema, cfg


def request(schema, n: int, seed: int = 0) -> dict:
    """A request of ``n`` candidates drawn from a random batch (raw values = ids for simulator data)."""
    b = random_batch(schema, n, seed=seed)
    sparse = b.sparse.to_dict() if schema.sparse else {}
    cands = []
    for i in range(n):
        c = {}
        for f in schema.sparse:
            jt = sparse[f.name]
            off = jt.offsets()
            vals = jt.values()[int(off[i]):int(off[i + 1])].tolist()
            c[f.name] = vals if f.multi_valued else vals[0]
        for j, f in enumerate(schema.dense):
            c[f.name] = float(b.dense[i, j])
        for g in schema.sequences:
            sb = b.sequences[g.name]
            off = sb.offsets
            s, e = int(off[i]), int(off[i + 1])
            for f in g.id_fields:
                c[g.column(f.name)] = sb.ids[f.name][s:e].tolist()
            for f in g.dense_fields:
                c[g.column(f.name)] = sb.dense[f.name][s:e].tolist()
        cands.append(c)
    return {"surface": 0, "context": {}, "candidates": cands}


def timed(fn, reps: int) -> dict[str, float]:
    """Median and p99 wall time of ``fn`` in ms over ``reps`` calls after 3 warm-up calls."""
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
    return {"p50": round(statistics.median(ts), 3), "p99": round(float(np.percentile(ts, 99)), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vm", choices=["vm", "gem"])
    ap.add_argument("--candidates", type=int, default=512)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--backends", default="eager,export,aoti")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    model, schema, cfg = vm_model() if args.model == "vm" else gem_model()
    backends = args.backends.split(",")
    build = "aoti" if "aoti" in backends else "export" if "export" in backends else "eager"
    out: dict = {"model": args.model, "candidates": args.candidates, "threads": args.threads,
                 "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        res = export_model(model, schema, cfg, Path(tmp) / "art", backend=build)
        out.update({k: round(v, 2) for k, v in res.items() if k.endswith("_s")})
        preds = {b: Predictor.load(Path(tmp) / "art", backend=b) for b in backends}
        eager = preds.get("eager") or Predictor.load(Path(tmp) / "art", backend="eager")
        parity = {}
        for b, p in preds.items():
            worst = 0.0
            for n in (1, 7, 64):
                batch = random_batch(schema, n, seed=n)
                worst = max(worst, float((p.logits(batch) - eager.logits(batch)).abs().max()))
            parity[b] = worst
        out["parity_max_abs_logit_diff"] = parity
        req = request(schema, args.candidates)
        batch, _ = eager.encode([req])
        out["encode_ms"] = timed(lambda: eager.encode([req]), args.reps)
        out["score_ms"] = {b: timed(lambda p=p: p.score(req), args.reps) for b, p in preds.items()}
        out["forward_ms"] = {b: timed(lambda p=p: p.logits(batch), args.reps) for b, p in preds.items()}
    out["load_after"] = os.getloadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
