"""Paired A/B: every arm's server up at once (all --cpus 0), one spinning raw-socket client on CPU 1 sends
blocks of requests to each in turn. usage: abpar.py OUT.json blocks block name=srcdir ..."""

import glob
import json
import os
import socket
import sys
import time

import numpy as np

from opengem.bench.serve_bench import ServerProcess, candidate_pool, make_request
from opengem.serve import arrow_io

os.sched_setaffinity(0, [1])
out, blocks, block = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
arms = [a.split("=", 1) for a in sys.argv[4:]]
model = os.environ.get("MODEL", "/work/serve_s3/work/vm-export")
ncand = int(os.environ.get("CANDS", "512"))
pool, surfaces, ctx = candidate_pool(os.environ.get("DATA", "/work/serve_s3/work/vmdata"), None)
bodies = [make_request(pool, surfaces, ctx, ncand, i, "arrow") for i in range(16)]
SPIN = not os.environ.get("BLOCKING")


def thr(pid):
    o = {}
    for d in glob.glob(f"/proc/{pid}/task/*"):
        st = open(d + "/stat").read()
        f = st[st.rindex(")") + 2 :].split()
        o[d.split("/")[-1]] = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    return o


class Client:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if SPIN:
            self.s.setblocking(False)
        self.buf = bytearray()
        self.raw = [
            (
                f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: {arrow_io.ARROW_STREAM}\r\n"
                f"Content-Length: {len(b)}\r\n\r\n"
            ).encode()
            + b
            for b in bodies
        ]

    def recv(self):
        while True:
            try:
                return self.s.recv(65536)
            except BlockingIOError:
                pass

    def post(self, i):
        mv = memoryview(self.raw[i % 16])
        while mv:
            try:
                mv = mv[self.s.send(mv) :]
            except BlockingIOError:
                pass
        buf = self.buf
        while (k := buf.find(b"\r\n\r\n")) < 0:
            buf += self.recv()
        head = bytes(buf[:k]).lower()
        n = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
        while len(buf) < k + 4 + n:
            buf += self.recv()
        del buf[: k + 4 + n]
        return int(head[9:12])


servers = {}
for name, src in arms:
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = src
    src, _, arm_model = src.partition(",")
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
        os.environ.get("BACKEND", "aoti"),
        "--cpus",
        "0",
        "--no-hot-swap",
    ]
    sp = ServerProcess(cmd, 1)
    port = sp.wait_ready()
    if old is None:
        del os.environ["PYTHONPATH"]
    else:
        os.environ["PYTHONPATH"] = old
    servers[name] = (sp, Client(port))
    for i in range(100):
        assert servers[name][1].post(i) == 200
res = {n: {"lat": [], "cpu_main": 0.0, "cpu_other": 0.0} for n, _ in arms}
load0 = os.getloadavg()
for b in range(blocks):
    for name, (sp, c) in servers.items():
        t0 = thr(sp.proc.pid)
        lat = res[name]["lat"]
        for i in range(block):
            t = time.perf_counter()
            st = c.post(b * block + i)
            lat.append(time.perf_counter() - t)
            assert st == 200
        t1 = thr(sp.proc.pid)
        main = str(sp.proc.pid)
        res[name]["cpu_main"] += t1[main] - t0[main]
        res[name]["cpu_other"] += sum(t1[k] - t0.get(k, 0) for k in t1 if k != main)
summary = {}
for name, d in res.items():
    v = np.array(d["lat"]) * 1e3
    n = len(v)
    summary[name] = dict(
        n=n,
        p50=np.percentile(v, 50),
        p90=np.percentile(v, 90),
        p99=np.percentile(v, 99),
        mean=float(v.mean()),
        cpu_loop_ms=d["cpu_main"] / n * 1e3,
        cpu_model_ms=d["cpu_other"] / n * 1e3,
    )
    s = summary[name]
    print(
        f"{name:8s} n {n} p50 {s['p50']:.2f} p90 {s['p90']:.2f} p99 {s['p99']:.2f} mean {s['mean']:.2f}"
        f" | server CPU/req event loop {s['cpu_loop_ms']:.2f} + model thread {s['cpu_model_ms']:.2f}"
    )
for sp, _ in servers.values():
    sp.stop()
json.dump(
    dict(
        summary=summary,
        lat={k: d["lat"] for k, d in res.items()},
        load_before=load0,
        load_after=os.getloadavg(),
        arms=arms,
        blocks=blocks,
        block=block,
        spin=SPIN,
        candidates=ncand,
        model=model,
    ),
    open(out, "w"),
    indent=1,
)
print("load", load0, os.getloadavg())
