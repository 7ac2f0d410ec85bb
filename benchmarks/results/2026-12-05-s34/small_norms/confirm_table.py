"""The confirmation on seeds 30-59 (session 34): GEM without norms, the recipe's GEM and DCNv2, paired.

    python confirm_table.py OUT      (probe.py's OUT: OUT/nonorm and OUT/base)
"""
import glob
import json
import statistics as st
import sys

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop import selection_ne

OUT = sys.argv[1]


def ne(p: str, split: str) -> float:
    with open(p) as fh:
        return selection_ne(json.load(fh)[split], "tasks")


def arm(d: str, fam: str, split: str) -> dict[int, float]:
    return {int(p.split("seed")[-1].split("/")[0]): ne(p, split)
            for p in glob.glob(f"{OUT}/{d}/runs/{fam}-*/result.json")}


for split in ('valid', 'test'):
    A = {"GEM no norms (s5)": arm("nonorm", "gem", split), "GEM recipe (s0)": arm("base", "gem", split),
         "DCNv2 s0": arm("base", "dcnv2", split)}
    print(f"## {split} NE, seeds 30-59")
    for k, v in A.items():
        x = list(v.values())
        print(f"{k}: n {len(x)} mean {st.mean(x):.4f} sd {st.stdev(x):.4f} median {st.median(x):.4f} "
              f"max {max(x):.4f}")
    for a, b in (("GEM no norms (s5)", "DCNv2 s0"), ("GEM no norms (s5)", "GEM recipe (s0)"),
                 ("GEM recipe (s0)", "DCNv2 s0")):
        ks = sorted(set(A[a]) & set(A[b]))
        d = [A[a][k] - A[b][k] for k in ks]
        m, h = mean_ci(d)
        lower = sum(x < 0 for x in d)
        print(f"{a} - {b}: {m:+.4f} [{m - h:+.4f}, {m + h:+.4f}] n {len(d)}, lower on {lower}")
