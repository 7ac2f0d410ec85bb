"""quiet.py CMD...: run CMD while every python/compiler process outside CMD's process tree (and not this
script's ancestors) is SIGSTOPped; resume them all afterwards."""

import os
import signal
import subprocess
import sys
import threading
import time

NAMES = (
    "python",
    "python3",
    "python3.11",
    "opengem",
    "cc1plus",
    "g++",
    "gcc",
    "ld",
    "as",
    "md5sum",
    "pytest",
)
me = os.getpid()


def ancestors(pid):
    out = set()
    while pid > 1:
        out.add(pid)
        try:
            pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
    return out


def tree(root):
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = set(), [root]
    while todo:
        p = todo.pop()
        out.add(p)
        todo += kids.get(p, [])
    return out


keep = ancestors(me)
stopped = set()
proc = subprocess.Popen(sys.argv[1:])
done = threading.Event()


def loop():
    while not done.is_set():
        mine = tree(proc.pid) | keep | {me}
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) in mine or int(d) in stopped:
                continue
            try:
                comm = open(f"/proc/{d}/comm").read().strip()
            except OSError:
                continue
            if comm.startswith(NAMES):
                try:
                    os.kill(int(d), signal.SIGSTOP)
                    stopped.add(int(d))
                except OSError:
                    pass
        time.sleep(1.0)


t = threading.Thread(target=loop, daemon=True)
t.start()
try:
    rc = proc.wait()
finally:
    done.set()
    t.join()
    for p in stopped:
        try:
            os.kill(p, signal.SIGCONT)
        except OSError:
            pass
    print(f"quiet.py: paused {len(stopped)} processes during the run, resumed them", file=sys.stderr)
sys.exit(rc)
