"""Time to first training step: eager, compile with an empty cache (cold), compile again in a new process
with the same cache folder (warm); prints the cold/warm ratio (GEM reports 7x from caching).

    .venv/bin/python benchmarks/compile_cache.py [--config configs/small.toml] [--batch 64] [--threads 1]

Each measurement is a fresh Python process (so in-memory caches never help); the model is the recipe's
model on random schema-conformant batches (sequences padded to max_len, as the trainer does when
compiling). "first step" = forward + backward + optimizer step of the first batch, after the model is built.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
from opengem.train.compile import apply_compile, compile_counters, configure_compile_cache
mode, cache, config = sys.argv[1:4]
batch, threads = int(sys.argv[4]), int(sys.argv[5])
if mode != "eager":
    configure_compile_cache(cache)
if threads:
    torch.set_num_threads(threads)
from opengem.data.random_batch import random_batch
from opengem.data.sim_config import SimConfig, sim_schema
from opengem.model.heads import masked_bce
from opengem.model.registry import build_model
from opengem.train.config import load_run_config
cfg = load_run_config(config, ["model.embedding.pad_to_max_len=true"])
schema = sim_schema(SimConfig.from_dict(dict(cfg.data.sim)))
torch.manual_seed(0)
model = build_model(schema, cfg.model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
batches = [random_batch(schema, batch, seed=i) for i in range(3)]
w = torch.ones(len(schema.tasks))
t_import = time.perf_counter() - t0
if mode != "eager":
    apply_compile(model)
def step(b):
    loss = masked_bce(model(b).logits, b.labels, b.label_mask, w)
    opt.zero_grad(); loss.backward(); opt.step()
t1 = time.perf_counter(); step(batches[0]); first = time.perf_counter() - t1
t2 = time.perf_counter(); step(batches[1]); step(batches[2]); steady = (time.perf_counter() - t2) / 2
print(json.dumps({"mode": mode, "import_build_s": t_import, "first_step_s": first, "steady_step_s": steady,
                  **(compile_counters() if mode != "eager" else {})}))
"""


def run_child(mode: str, cache: str, args: argparse.Namespace) -> dict:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", CHILD, mode, cache, args.config, str(args.batch),
                        str(args.threads)], capture_output=True, text=True, timeout=3600)
    if r.returncode:
        sys.exit(f"{mode} failed:\n{r.stderr[-4000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["process_s"] = time.perf_counter() - t
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="configs/small.toml")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cache", default="", help="cache folder (default: a fresh temp folder, removed after)")
    args = p.parse_args()
    cache = args.cache or tempfile.mkdtemp(prefix="opengem-cc-")
    shutil.rmtree(cache, ignore_errors=True)
    print(f"config {args.config}, batch {args.batch}, threads {args.threads}, cache {cache}, "
          f"load average {os.getloadavg()}")
    rows = [run_child("eager", cache, args), run_child("cold", cache, args), run_child("warm", cache, args)]
    print(f"{'mode':<6}{'first step s':>14}{'steady step s':>15}{'process s':>11}{'fx hit':>8}{'fx miss':>8}")
    for r in rows:
        print(f"{r['mode']:<6}{r['first_step_s']:>14.2f}{r['steady_step_s']:>15.3f}{r['process_s']:>11.1f}"
              f"{r.get('fxgraph_cache_hit', '-'):>8}{r.get('fxgraph_cache_miss', '-'):>8}")
    cold, warm = rows[1]["first_step_s"], rows[2]["first_step_s"]
    print(f"cold/warm first-step ratio: {cold / warm:.1f}x   "
          f"(eager first step {rows[0]['first_step_s']:.2f}s)"
          f"   load average after: {os.getloadavg()}")
    print(json.dumps(rows))
    if not args.cache:
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
