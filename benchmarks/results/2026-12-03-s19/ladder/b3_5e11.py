"""5e11 on session 16's 6.4M-row stream (4.8M training rows), seed 0: each family's 1.58e11 winner, which
the 2.8M-row stream holds only in 1.3-2.8 passes at 5e11, beside its 5e11 choice there. Seed-0 validation and
test NE (mean of pooled click and conversion NE on the first 16,384 rows of each day), passes over the
training rows. Then each family's seed-0 validation winner with its seeds' test NE, and GEM minus each family
(95 % Welch) where there are two seeds or more.

    python b3_5e11.py /work/s19/b3/runs > b3_5e11.txt
"""
import runpy
import sys
from pathlib import Path

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop_report import format_difference, welch_difference

here = Path(__file__).resolve().parent
g = runpy.run_path(str(here.parents[1] / "2026-12-03-s18" / "ladder" / "compare_recent.py"),
                   run_name="compare_recent")
run_row = g["run_row"]
TRAIN_ROWS = 4_800_000
runs = [r for d in sorted(Path(sys.argv[1]).iterdir()) if (r := run_row(d)) is not None]
rows = sorted((r for r in runs if r["seed"] == 0), key=lambda r: (r["family"], r["valid_ne"]))
print("seed 0:")
print("family size rate MFLOP passes valid_NE test_NE pooled_calibration(click, conversion)")
for r in rows:
    print(f"{r['family']:6s} s{r['size']:<3d} {r['lr']:<6g} {r['flops_per_example'] / 1e6:.3f} "
          f"{r['examples'] / TRAIN_ROWS:.2f} {r['valid_ne']:.4f} {r['test_ne']:.4f} "
          f"({r['test_cal_all_click']:.2f}, {r['test_cal_all_conversion']:.2f})")

ne = {}
for fam in ("gem", "dcnv2", "dlrm"):
    best = min((r for r in rows if r["family"] == fam), key=lambda r: r["valid_ne"])
    ne[fam] = [r["test_ne"] for r in sorted(runs, key=lambda r: r["seed"])
               if (r["family"], r["size"], r["lr"]) == (fam, best["size"], best["lr"])]
    mean, half = mean_ci(ne[fam]) if len(ne[fam]) > 1 else (ne[fam][0], float("nan"))
    print(f"{fam}: s{best['size']} at {best['lr']:g}: test NE {mean:.4f} ± {half:.4f} ({len(ne[fam])} seeds: "
          + ", ".join(f"{x:.4f}" for x in ne[fam]) + ")")
for fam in ("dcnv2", "dlrm"):  # no oracle line: the oracle NE of this stream's test slice was never computed
    if len(ne["gem"]) > 1 and len(ne[fam]) > 1:
        print(f"GEM minus {fam}: {format_difference(welch_difference(ne['gem'], ne[fam]))}")
