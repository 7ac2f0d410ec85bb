"""Pilot: does a smaller batch (more optimizer steps at the same examples) change the mid-budget ranking?
GEM s1, DIN s1, DCNv2 s2 (their 5-seed study sizes at 1.58e10 and 5e10), batch 64/128/256, lr 3e-3/1e-2,
seeds 0-2, the default study's stream and rule for steps (same examples per budget), two worker processes."""
import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

WT = "/work/s24/wt"
PY = "/work/main/.venv/bin/python"
DATA = "/work/s24/det/a/data"
OUT = "/work/s24/pilot"
fams = [("gem", 1), ("din", 1), ("dcnv2", 2)]
budgets = [1, 2]
batches = [64, 128, 256]
lrs = ["0.003", "0.01"]
seeds = [0, 1, 2]
jobs = [(b, f, s, bs, lr, seed)
        for b in budgets for (f, s) in fams for bs in batches for lr in lrs for seed in seeds]
env = {**os.environ, "PYTHONPATH": f"{WT}/src", "OPENGEM_CPU_LINEAR_CACHE": f"{OUT}/cpu_linear.json"}

def one(job):
    b, f, s, bs, lr, seed = job
    out = f"{OUT}/bs{bs}"
    name = f"{f}-s{s}-b{b}-lr{float(lr):g}-seed{seed}"
    log = f"{OUT}/logs/bs{bs}-{name}.txt"
    os.makedirs(os.path.dirname(log), exist_ok=True)
    t = time.time()
    with open(log, "w") as fh:
        cmd = [PY, "-m", "opengem.bench.isoflop_worker", "configs/isoflop.toml", out, DATA, f, str(s), str(b),
               lr, str(seed), f"data.batch_size={bs}"]
        code = subprocess.call(cmd, cwd=WT, env=env, stdout=fh, stderr=subprocess.STDOUT)
    rec = {"family": f, "size": s, "budget": b, "batch": bs, "lr": float(lr), "seed": seed, "exit": code,
           "seconds": round(time.time() - t, 1)}
    try:
        r = json.load(open(f"{out}/runs/{name}/result.json"))
        rec.update({k: r.get(k) for k in ("steps", "examples")})
        rec["result"] = r
    except Exception as e:
        rec["error"] = str(e)
    with open(f"{OUT}/results.jsonl", "a") as fh:
        fh.write(json.dumps(rec) + "\n")
    return rec

with ThreadPoolExecutor(2) as pool:
    for rec in pool.map(one, jobs):
        print(rec["family"], rec["budget"], rec["batch"], rec["lr"], rec["seed"], rec["exit"], rec["seconds"],
              flush=True)
