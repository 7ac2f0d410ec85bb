"""5e11 on session 16's 6.4M-row stream (4.8M training rows), seed 0: each family's 1.58e11 winner, which
the 2.8M-row stream holds only in 1.3-2.8 passes at 5e11, beside its 5e11 choice there. Seed-0 validation and
test NE (mean of pooled click and conversion NE on the first 16,384 rows of each day), passes over the
training rows.

    python b3_5e11.py /work/s19/b3/runs > b3_5e11.txt
"""
import runpy
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
run_row = runpy.run_path(str(here.parents[1] / "2026-12-03-s18" / "ladder" / "compare_recent.py"),
                         run_name="compare_recent")["run_row"]
TRAIN_ROWS = 4_800_000
rows = sorted((r for d in sorted(Path(sys.argv[1]).iterdir()) if (r := run_row(d)) is not None),
              key=lambda r: (r["family"], r["valid_ne"]))
print("family size rate MFLOP passes valid_NE test_NE pooled_calibration(click, conversion)")
for r in rows:
    print(f"{r['family']:6s} s{r['size']:<3d} {r['lr']:<6g} {r['flops_per_example'] / 1e6:.3f} "
          f"{r['examples'] / TRAIN_ROWS:.2f} {r['valid_ne']:.4f} {r['test_ne']:.4f} "
          f"({r['test_cal_all_click']:.2f}, {r['test_cal_all_conversion']:.2f})")
