"""The five demo seeds side by side: pooled NE of GEM, DLRM and DCNv2, the share of the DLRM -> oracle gap
GEM closes, GEM's calibration, and GEM minus each baseline over the seeds (95 % t, paired by seed).

    python summary.py [DIR]     (DIR holds demo_seed0.txt ... demo_seed4.txt, the demo's printed output)
"""
import re
import sys
from pathlib import Path

from opengem.bench.fit import mean_ci

NUM = r"\s+(\S+)"
folder = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
rows = []
for s in range(5):
    f = folder / f"demo_seed{s}.txt"
    if not f.exists():
        continue
    t = f.read_text()
    ne = {}
    for task in ("click", "conversion"):
        g = [float(x) for x in re.search(rf"^all/{task}\s+\d+" + NUM * 10, t, re.M).groups()]
        share = re.search(rf"^all/{task}\s+(-?[\d.]+)%\s+(-?[\d.]+)%", t, re.M)
        # GEM, DLRM, DCNv2 NE; GEM's calibration; GEM's share of the DLRM -> oracle gap
        ne[task] = (g[0], g[3], g[6], g[2], float(share.group(1)))
    verdict = {m: re.search(rf"^{m}\s+(.*)$", t, re.M).group(1) for m in ("gem", "dlrm", "dcnv2")}
    cells = re.findall(r"^(\w+/\w+)\s+([\d.]+) \[[\d.,]+\] t[\d.]+\s+([\d.]+) \[", t, re.M)
    gem_cells = [float(c[1]) for c in cells if not c[0].startswith("all/")]
    rows.append((s, ne, verdict, min(gem_cells), max(gem_cells)))

print("| seed | all/click NE GEM / DLRM / DCNv2 | all/conversion NE GEM / DLRM / DCNv2 "
      "| GEM gap share click / conv | GEM pooled cal click / conv | GEM cells | GEM best on both? |")
print("|---|---|---|---|---|---|---|")
for s, ne, _, lo, hi in rows:
    c, q = ne["click"], ne["conversion"]
    best = c[0] < min(c[1], c[2]) and q[0] < min(q[1], q[2])
    print(f"| {s} | {c[0]:.4f} / {c[1]:.4f} / {c[2]:.4f} | {q[0]:.4f} / {q[1]:.4f} / {q[2]:.4f} | "
          f"{c[4]:.1f} % / {q[4]:.1f} % | {c[3]:.2f} / {q[3]:.2f} | {lo:.2f}-{hi:.2f} | "
          f"{'yes' if best else 'NO'} |")
print()
for s, _, verdict, _, _ in rows:
    print(f"seed {s}: " + "; ".join(f"{m}: {v}" for m, v in verdict.items()))
print()
for task in ("click", "conversion"):
    for name, col in (("DLRM", 1), ("DCNv2", 2)):
        d = [ne[task][0] - ne[task][col] for _, ne, *_ in rows]
        if len(d) > 1:
            m, h = mean_ci(d)
            print(f"GEM - {name}, all/{task}: {m:+.4f} [{m - h:+.4f}, {m + h:+.4f}]")
