"""5e11 on the 6.4M-row stream: GEM with the cross branch (s17) beside session 19's three seeds there of
GEM s10, DCNv2 s9 and DLRM s14 (the seed-0 validation winners at 1.58e11 / 5e11 on the 2.8M-row stream);
s17 at 3e-3, where the rate re-check moved it, and at 1e-2, the budget's rate for GEM.

Test NE (mean of pooled click and conversion NE) on the study's 16,384 test rows (RUN/result.json) and on the
whole test day (800,000 rows), with the whole validation day, as ``../size_seeds/whole_days.py`` scores
runs (session 19's runs as ``../calibrate_frontier.py`` scored them raw where those scores are missing). GEM
s17 minus each with a 95 % Welch interval.

    python compare_b3.py S19_B3_RUNS CROSS_B3_RUNS CAL_DIR WHOLE_DIR > compare_b3.txt
"""
import json
import sys
from pathlib import Path

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop import selection_ne
from opengem.bench.isoflop_report import format_difference, welch_difference

s19_runs, cross_runs, cal_dir, whole_dir = (Path(p) for p in sys.argv[1:5])
# s17's cell at 3e-3: the rate re-check at seed 0 (validation 0.7727 against 0.7838 at 1e-2) moved it there
CELLS = {"gem s17 (cross)": (cross_runs, "gem-s17-b2-lr0.003"),
         "gem s17 at 1e-2": (cross_runs, "gem-s17-b2-lr0.01"), "gem s10": (s19_runs, "gem-s10-b2-lr0.01"),
         "dcnv2 s9": (s19_runs, "dcnv2-s9-b2-lr0.003"), "dlrm s14": (s19_runs, "dlrm-s14-b2-lr0.003")}



def point(xs: list[float]) -> str:
    if not xs:
        return "no runs"
    mean, half = mean_ci(xs) if len(xs) > 1 else (xs[0], float("nan"))
    return f"{mean:.4f} ± {half:.4f} ({len(xs)} seeds)"


t16, tday, vday = {}, {}, {}
for label, (root, stem) in CELLS.items():
    runs = sorted(root.glob(f"{stem}-seed*"))
    res = [json.loads((d / "result.json").read_text()) for d in runs if (d / "result.json").exists()]
    t16[label] = [selection_ne(r["test"], "tasks") for r in res]
    vday[label] = []
    day = []
    for d in runs:
        if (p := whole_dir / f"{d.name}.json").exists():
            doc = json.loads(p.read_text())
            day.append(doc["test"]["ne"])
            vday[label].append(doc["valid"]["ne"])
        elif (p := cal_dir / f"b3__{d.name}.json").exists():
            day.append(selection_ne(json.loads(p.read_text())["raw"], "tasks"))
    tday[label] = day
    print(f"{label:16} test NE (16,384 rows) {point(t16[label])}; whole test day {point(tday[label])}"
          + (f"; whole validation day {point(vday[label])}" if vday[label] else ""))
ref = "gem s17 (cross)"
for other in list(CELLS)[1:]:
    for what, t in (("16,384 rows", t16), ("whole day", tday)):
        if len(t[ref]) > 1 and len(t[other]) > 1:
            print(f"GEM s17 minus {other}, {what}: {format_difference(welch_difference(t[ref], t[other]))}")
