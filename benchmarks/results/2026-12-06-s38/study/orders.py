"""Each family's chosen cell per budget under two data orders, on validation (the rule's 3-seed mean) and on
the whole test day (the frontier), from two studies' run tables and isoflop.json files.

    python orders.py OLD_RUNS.csv[,MORE.csv] OLD_isoflop.json NEW_RUNS.csv NEW_isoflop.json
"""

import collections
import csv
import json
import statistics
import sys


def best_valid(paths: str) -> dict[tuple[str, int], tuple[float, str]]:
    """(family, budget) -> the lowest 3-seed mean validation NE over its cells with 3 seeds, and the cell."""
    cells = collections.defaultdict(list)
    for path in paths.split(","):
        for r in csv.DictReader(open(path)):
            key = (r["family"], int(r["budget"]), int(r["size"]), float(r["lr"]))
            cells[key].append(float(r["valid_ne"]))
    out: dict[tuple[str, int], tuple[float, str]] = {}
    for (fam, b, size, lr), v in cells.items():
        if len(v) >= 3:
            m = statistics.mean(v)
            if (fam, b) not in out or m < out[(fam, b)][0]:
                out[(fam, b)] = (m, f"s{size} lr {lr:g}")
    return out


def frontier(path: str) -> dict[tuple[str, int], float]:
    d = json.load(open(path))
    return {(fam, p["budget"]): p["ne"] for fam, pts in d["frontier"].items() for p in pts}


old_v, new_v = best_valid(sys.argv[1]), best_valid(sys.argv[3])
old_t, new_t = frontier(sys.argv[2]), frontier(sys.argv[4])
print("| family | budget | old cell | new cell | valid NE old -> new (3-seed mean) "
      "| test NE old -> new (whole day) |")
print("|---|---|---|---|---|---|")
for fam, b in sorted(new_v, key=lambda k: (["gem", "dcnv2", "dlrm"].index(k[0]), k[1])):
    (ov, oc), (nv, nc) = old_v[(fam, b)], new_v[(fam, b)]
    ot, nt = old_t[(fam, b)], new_t[(fam, b)]
    print(f"| {fam} | {b} | {oc} | {nc} | {ov:.4f} -> {nv:.4f} ({nv - ov:+.4f}) | {ot:.4f} -> {nt:.4f} "
          f"({nt - ot:+.4f}) |")
