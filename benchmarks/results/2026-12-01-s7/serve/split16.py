"""Both servers up (CPU 0), one spinning load client (CPU 1) sends alternating blocks at C clients;
per block: req/s and each server thread's CPU per request.
usage: split16.py OUT.json blocks reqs name=backend[,srcdir[,model]] ..."""

import glob
import json
import os
import sys

import numpy as np

from opengem.bench.load_client import run_load
from opengem.bench.serve_bench import ServerProcess, candidate_pool, http_get, make_request


def metric(port, name):
    txt = http_get(port, "/metrics")[1].decode()
    for line in txt.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


os.sched_setaffinity(0, [1])
out, blocks, reqs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
arms = [a.split("=", 1) for a in sys.argv[4:]]
model = os.environ.get("MODEL", "/work/serve_s3/work/vm-export")
ncand = int(os.environ.get("CANDS", "512"))
clients = int(os.environ.get("CLIENTS", "16"))
body = os.environ.get("BODY", "arrow")
pool, surfaces, ctx = candidate_pool(os.environ.get("DATA", "/work/serve_s3/work/vmdata"), None)
bodies = [make_request(pool, surfaces, ctx, ncand, i, body) for i in range(32)]
bodies = [b if isinstance(b, bytes) else json.dumps(b).encode() for b in bodies]


def thr(pid):
    o = {}
    for d in glob.glob(f"/proc/{pid}/task/*"):
        try:
            st = open(d + "/stat").read()
        except OSError:
            continue
        name = st[st.index("(") + 1 : st.rindex(")")]
        f = st[st.rindex(")") + 2 :].split()
        o[d.split("/")[-1]] = (name, (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK"))
    return o


servers = {}
for name, spec in arms:
    backend, src, arm_model = (spec.split(",") + ["", ""])[:3]
    env_old = os.environ.get("PYTHONPATH")
    if src:
        os.environ["PYTHONPATH"] = src
    cmd = [
        sys.executable,
        "-m",
        "opengem.cli",
        "serve",
        "--model",
        arm_model or model,
        "--port",
        "0",
        "--backend",
        backend,
        "--cpus",
        "0",
        "--no-hot-swap",
        *os.environ.get("EXTRA", "").split(),
    ]
    sp = ServerProcess(cmd, 1)
    port = sp.wait_ready()
    if src:
        if env_old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = env_old
    servers[name] = (sp, port)
    run_load(port, bodies, clients, 200, 30, warmup=3, spin=True)
res = {n: {"rps": [], "p50": [], "p99": [], "cpu": {}, "n": 0, "err": 0} for n, _ in arms}
load0 = os.getloadavg()
for _ in range(blocks):
    for name, (sp, port) in servers.items():
        b0, s0 = metric(port, "opengem_batches_total"), metric(port, "opengem_batch_cpu_seconds_sum")
        t0 = thr(sp.proc.pid)
        r = run_load(port, bodies, clients, reqs, 60, warmup=1, spin=True)
        t1 = thr(sp.proc.pid)
        d = res[name]
        d.setdefault("batches", 0)
        d["batches"] += metric(port, "opengem_batches_total") - b0
        d.setdefault("score_cpu", 0.0)
        d["score_cpu"] += metric(port, "opengem_batch_cpu_seconds_sum") - s0
        d["n"] += len(r.latencies)
        d["err"] += r.errors
        d["rps"].append(len(r.latencies) / r.seconds)
        lat = np.asarray(r.latencies) * 1e3
        d["p50"].append(float(np.percentile(lat, 50)))
        d["p99"].append(float(np.percentile(lat, 99)))
        for tid, (tn, c) in t1.items():
            key = "main" if tid == str(sp.proc.pid) else tn
            d["cpu"][key] = d["cpu"].get(key, 0.0) + c - t0.get(tid, (tn, 0.0))[1]
for sp, _ in servers.values():
    sp.stop()
summary = {"load_start": load0, "load_end": os.getloadavg(), "clients": clients, "cands": ncand, "body": body}
for name, d in res.items():
    cpu_ms = {k: round(v / d["n"] * 1e3, 3) for k, v in sorted(d["cpu"].items()) if v > 0}
    summary[name] = {
        "rps_median": float(np.median(d["rps"])),
        "rps": [round(x, 1) for x in d["rps"]],
        "p50_median": float(np.median(d["p50"])),
        "p99_median": float(np.median(d["p99"])),
        "cpu_ms_per_req": cpu_ms,
        "cpu_total_ms": round(sum(cpu_ms.values()), 3),
        "errors": d["err"],
        "req_per_batch": round(d["n"] / max(d["batches"], 1), 2),
        "score_cpu_ms_per_req": round(d["score_cpu"] / d["n"] * 1e3, 3),
    }
print(json.dumps(summary, indent=1))
json.dump(summary, open(out, "w"), indent=1)
