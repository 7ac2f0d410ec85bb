"""Pilot (session 25), part 4: GEM s6 (d 4 + two rank-8 cross layers, the 5e10 optimum) at 1.58e11, lr 3e-3
and 1e-2, seeds 0-2: does the narrow optimum hold at the study's largest budget (its GEM choice there: s2 =
d 8 + cross)?"""
import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

WT = "/work/s25/wt"
PY = "/work/main/.venv/bin/python"
DATA = "/work/s24/det/a/data"
OUT = "/work/s25/pilot"
sizes = [6]
jobs = [(b, s, lr, seed) for b in [3] for seed in [0, 1, 2] for s in sizes for lr in ["0.003", "0.01"]]
env = {**os.environ, "PYTHONPATH": f"{WT}/src", "OPENGEM_CPU_LINEAR_CACHE": f"{OUT}/cpu_linear.json"}

def one(job):
    b, s, lr, seed = job
    name = f"gem-s{s}-b{b}-lr{float(lr):g}-seed{seed}"
    log = f"{OUT}/logs/{name}.txt"
    os.makedirs(os.path.dirname(log), exist_ok=True)
    t = time.time()
    with open(log, "w") as fh:
        code = subprocess.call([PY, "-m", "opengem.bench.isoflop_worker", "configs/isoflop-pilot25.toml",
                                f"{OUT}/bs256",
                                DATA, "gem", str(s), str(b), lr, str(seed)], cwd=WT, env=env, stdout=fh,
                               stderr=subprocess.STDOUT)
    rec = {"family": "gem", "size": s, "budget": b, "batch": 256, "lr": float(lr), "seed": seed, "exit": code,
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
        print(rec["size"], rec["budget"], rec["lr"], rec["seed"], rec["exit"], rec["seconds"],
              rec.get("result", {}).get("valid_ne"), flush=True)
