"""Pilot (session 25), part 5: DLRM s0 (the study's DLRM choice at every budget) in the pilot's own setting,
so that no row of the comparison is quoted from session 23."""
import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

WT = "/work/s25/wt"
PY = "/work/main/.venv/bin/python"
DATA = "/work/s24/det/a/data"
OUT = "/work/s25/pilot"
fams = [("dlrm", 0)]
jobs = [(b, f, s, lr, seed) for b in [1, 2] for seed in [0, 1, 2] for (f, s) in fams
        for lr in ["0.003", "0.01"]]
env = {**os.environ, "PYTHONPATH": f"{WT}/src", "OPENGEM_CPU_LINEAR_CACHE": f"{OUT}/cpu_linear.json"}

def one(job):
    b, f, s, lr, seed = job
    name = f"{f}-s{s}-b{b}-lr{float(lr):g}-seed{seed}"
    log = f"{OUT}/logs/{name}.txt"
    os.makedirs(os.path.dirname(log), exist_ok=True)
    t = time.time()
    with open(log, "w") as fh:
        code = subprocess.call([PY, "-m", "opengem.bench.isoflop_worker", "configs/isoflop-pilot25.toml",
                                f"{OUT}/bs256",
                                DATA, f, str(s), str(b), lr, str(seed)], cwd=WT, env=env, stdout=fh,
                               stderr=subprocess.STDOUT)
    rec = {"family": f, "size": s, "budget": b, "batch": 256, "lr": float(lr), "seed": seed, "exit": code,
           "seconds": round(time.time() - t, 1)}
    try:
        r = json.load(open(f"{OUT}/bs256/runs/{name}/result.json"))
        rec.update({k: r.get(k) for k in ("steps", "examples")})
        rec["result"] = r
    except Exception as e:
        rec["error"] = str(e)
    with open(f"{OUT}/results.jsonl", "a") as fh:
        fh.write(json.dumps(rec) + "\n")
    return rec

with ThreadPoolExecutor(2) as pool:
    for rec in pool.map(one, jobs):
        print(rec["family"], rec["size"], rec["budget"], rec["lr"], rec["seed"], rec["exit"], rec["seconds"],
              rec.get("result", {}).get("valid_ne"), flush=True)
