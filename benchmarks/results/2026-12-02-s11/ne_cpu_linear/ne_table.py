"""NE per surface x task: pytorch vs onednn dense layers, per model, over seeds, and the paired difference.

    python ne_table.py [RUNS_DIR]      # the run folders ne_check.sh wrote (default /work/s11/ne2)
"""

import json
import statistics
import sys
from pathlib import Path

N = Path(sys.argv[1] if len(sys.argv) > 1 else "/work/s11/ne2")


def final(run: str) -> dict:
    for line in (N / run / "metrics.jsonl").read_text().splitlines()[::-1]:
        d = json.loads(line)
        if d.get("final"):
            return d["metrics"]
    raise SystemExit(f"{run}: no final evaluation")


def done(m: str, s: int) -> bool:
    return all((N / f"{m}-{k}-s{s}/metrics.jsonl").exists() for k in ("pytorch", "onednn"))


def fmt(xs: list[float]) -> str:
    return " / ".join(f"{x:.4f}" for x in xs)


for m in ("gem", "dcnv2"):
    seeds = [s for s in range(3) if done(m, s)]
    if not seeds:
        continue
    runs = {k: [final(f"{m}-{k}-s{s}") for s in seeds] for k in ("pytorch", "onednn")}
    print(f"\n{m}: seeds {seeds}")
    print("| cell | BLAS NE (per seed) | oneDNN NE (per seed) | mean diff oneDNN - BLAS | seed sd (BLAS) |")
    print("|---|---|---|---|---|")
    for cell in runs["pytorch"][0]:
        a = [r[cell]["ne"] for r in runs["pytorch"]]
        b = [r[cell]["ne"] for r in runs["onednn"]]
        diff = statistics.mean(y - x for x, y in zip(a, b))
        sd = statistics.stdev(a) if len(a) > 1 else float("nan")
        print(f"| {cell} | {fmt(a)} | {fmt(b)} | {diff:+.4f} | {sd:.4f} |")
