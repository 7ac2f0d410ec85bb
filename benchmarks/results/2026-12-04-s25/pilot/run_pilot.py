"""Pilot (session 25): every family's ladder below its edge at the default iso-FLOP study's mid budgets, in
five parts run one after another (``python run_pilot.py PART``; sizes are the ladder indices of
isoflop-pilot25.toml, budgets its indices 1 = 1.58e10, 2 = 5e10, 3 = 1.58e11). Every run: the study's
worker on its 6.4M-row stream, lr 3e-3 and 1e-2, seeds 0-2, batch 256, the cpu_linear record of session
24's batch pilot (whose GEM s1, DIN s1 and DCNv2 s2 runs are the comparison),
results appended to results.jsonl.

1: GEM s3 (s1 at d 4), s5 (s3 with a 2x2 Wukong, k 2, MLP [16]), s6 (s3 + two rank-8 cross layers); 1.58e10,
   5e10
2: every baseline one or two sizes below its edge (DCNv2 s3 d 4 MLP [8, 4], s4 d 2; DLRM s3 d 4, s4 d 4 MLP
   [16, 8]; DIN s3 d 4 small MLPs, s4 d 4); 1.58e10, 5e10
3: GEM below s5 (s7 s5 + the cross layers, s8 s5 reading 4 events, s9 s5 with one CLS token); 1.58e10, one
   worker (it ran beside part 2)
4: GEM s6 at 1.58e11: does the narrow optimum hold at the study's largest budget?
5: DLRM s0 (the study's DLRM choice) in this setting, so that no row of the comparison is quoted from
   session 23
"""
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

WT = "/work/s25/wt"
PY = "/work/main/.venv/bin/python"
DATA = "/work/s24/det/a/data"
OUT = "/work/s25/pilot"
# part: (budgets, [(family, size)], workers)
PARTS = {
    1: ([1, 2], [("gem", 3), ("gem", 5), ("gem", 6)], 2),
    2: ([1, 2], [("dcnv2", 3), ("dcnv2", 4), ("dlrm", 3), ("dlrm", 4), ("din", 3), ("din", 4)], 2),
    3: ([1], [("gem", 7), ("gem", 8), ("gem", 9)], 1),
    4: ([3], [("gem", 6)], 2),
    5: ([1, 2], [("dlrm", 0)], 2),
}
env = {**os.environ, "PYTHONPATH": f"{WT}/src", "OPENGEM_CPU_LINEAR_CACHE": f"{OUT}/cpu_linear.json"}


def one(job):
    b, f, s, lr, seed = job
    name = f"{f}-s{s}-b{b}-lr{float(lr):g}-seed{seed}"
    log = f"{OUT}/logs/{name}.txt"
    os.makedirs(os.path.dirname(log), exist_ok=True)
    t = time.time()
    with open(log, "w") as fh:
        code = subprocess.call([PY, "-m", "opengem.bench.isoflop_worker", "configs/isoflop-pilot25.toml",
                                f"{OUT}/bs256", DATA, f, str(s), str(b), lr, str(seed)], cwd=WT, env=env,
                               stdout=fh, stderr=subprocess.STDOUT)
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


if __name__ == "__main__":
    budgets, cells, workers = PARTS[int(sys.argv[1])]
    jobs = [(b, f, s, lr, seed) for b in budgets for seed in [0, 1, 2] for (f, s) in cells
            for lr in ["0.003", "0.01"]]
    with ThreadPoolExecutor(workers) as pool:
        for rec in pool.map(one, jobs):
            print(rec["family"], rec["size"], rec["budget"], rec["lr"], rec["seed"], rec["exit"],
                  rec["seconds"], flush=True)
