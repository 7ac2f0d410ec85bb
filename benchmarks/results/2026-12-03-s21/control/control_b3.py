"""Session 20's open control at 5e11 on the 6.4M-row stream: GEM s10 *without* the cross branch at 3e-3 (the
rate GEM's re-check chose for s17 there), seeds 0-2, beside GEM s17 (two rank-8 cross layers) at 3e-3, and
session 19's DCNv2 s9 and DLRM s14 (3e-3). Does the 5e11 win belong to the branch or to the rate?

Test NE (mean of pooled click and conversion NE) on the study's 16,384 test rows and on the whole test day
(800,000 rows, ``../../2026-12-03-s20/size_seeds/whole_days.py score``), 95 % t; differences 95 % Welch.

    python control_b3.py S19_B3_RUNS CROSS_B3_RUNS WHOLE_DIR > control_b3.txt
"""
import json
import sys
from pathlib import Path

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop import selection_ne
from opengem.bench.isoflop_report import format_difference, welch_difference

s19_runs, cross_runs, whole_dir = (Path(p) for p in sys.argv[1:4])
CELLS = {"gem s10, 3e-3 (no branch)": (cross_runs, "gem-s10-b2-lr0.003"),
         "gem s17, 3e-3 (branch)": (cross_runs, "gem-s17-b2-lr0.003"),
         "gem s10, 1e-2 (session 19)": (s19_runs, "gem-s10-b2-lr0.01"),
         "dcnv2 s9, 3e-3": (s19_runs, "dcnv2-s9-b2-lr0.003"),
         "dlrm s14, 3e-3": (s19_runs, "dlrm-s14-b2-lr0.003")}


def point(xs: list[float]) -> str:
    mean, half = mean_ci(xs)
    return f"{mean:.4f} ± {half:.4f} ({len(xs)} seeds)"


val, t16, tday = {}, {}, {}
for label, (root, stem) in CELLS.items():
    runs = sorted(root.glob(f"{stem}-seed*"))
    res = [json.loads((d / "result.json").read_text()) for d in runs]
    val[label] = [selection_ne(r["valid"], "tasks") for r in res]
    t16[label] = [selection_ne(r["test"], "tasks") for r in res]
    tday[label] = [json.loads((whole_dir / f"{d.name}.json").read_text())["test"]["ne"] for d in runs]
    print(f"{label:28} validation (16,384 rows) {point(val[label])}; test (16,384 rows) {point(t16[label])}; "
          f"whole test day {point(tday[label])}")
pairs = [("gem s17, 3e-3 (branch)", "gem s10, 3e-3 (no branch)"),
         ("gem s10, 3e-3 (no branch)", "gem s10, 1e-2 (session 19)"),
         ("gem s10, 3e-3 (no branch)", "dcnv2 s9, 3e-3"), ("gem s10, 3e-3 (no branch)", "dlrm s14, 3e-3"),
         ("gem s17, 3e-3 (branch)", "dcnv2 s9, 3e-3")]
for a, b in pairs:
    for what, t in (("16,384 rows", t16), ("whole day", tday)):
        print(f"{a} minus {b}, {what}: {format_difference(welch_difference(t[a], t[b]))}")
