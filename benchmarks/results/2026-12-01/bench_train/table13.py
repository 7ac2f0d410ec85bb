"""The before/after `bench train` table of the closing note, from run13.sh's JSON files."""

import glob
import json
import os
import sys

FOLDER = sys.argv[1] if len(sys.argv) > 1 else "."


def pct(xs: list[float]) -> str:
    return ", ".join(f"{x * 100:.1f}%" for x in xs)


rows: dict[tuple[str, str, str], list[dict]] = {}
for f in sorted(glob.glob(f"{FOLDER}/*.json")):
    tree, prec, _rep = os.path.basename(f)[:-5].split("-")
    for r in json.load(open(f))["runs"]:
        rows.setdefault((r["model"], prec, tree), []).append(r)
print("| model | precision | tree | examples/s | MFU executed | MFU at max_len | peak GFLOP/s | peak MB "
      "| loader x |")
print("|---|---|---|---|---|---|---|---|---|")
for m, p, t in sorted(rows, key=lambda k: (k[0], k[1], k[2] != "base")):
    rs = rows[(m, p, t)]
    eps = ", ".join(f"{r['examples_per_s']:,.0f}" for r in rs)
    mfu = pct([r["mfu"] for r in rs]) + ("" if t == "new" else " (max_len)")
    full = pct([r.get("mfu_full", r["mfu"]) for r in rs])
    peak = ", ".join(f"{r['peak_flops'] / 1e9:.0f}" for r in rs)
    loader = min(r.get("loader_examples_per_s", 0) / r["examples_per_s"] for r in rs)
    tree = "6208131" if t == "base" else "after"
    mem = rs[0]["peak_mem_mb"]
    print(f"| {m} | {p} | {tree} | {eps} | {mfu} | {full} | {peak} | {mem:.0f} | {loader:.0f}x |")
