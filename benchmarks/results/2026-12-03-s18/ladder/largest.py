"""The recency sizes that fit the 6.4M-row stream at 1.58e12 (ladder_recent_b3.toml) beside session
17's seed-0 validation NE of every size there (``../../2026-12-03-s17/compare.txt``, lines "b3 FAMILY: ...").

    python largest.py OUT/runs > largest.txt
"""
import json
import re
import sys
from pathlib import Path

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop import selection_ne
from opengem.bench.isoflop_report import format_difference, welch_difference

here = Path(__file__).resolve().parent
for line in (here.parents[1] / "2026-12-03-s17" / "compare.txt").read_text().splitlines():
    m = re.match(r"\s+b3 (\w+): (s\d+@.*)$", line)
    if m:
        print(f"session 17, seed-0 validation NE at 1.58e12, {m[1]}: {m[2]}")
test: dict[str, list[float]] = {}
for d in sorted(Path(sys.argv[1]).iterdir()):
    if not (d / "result.json").exists():
        continue
    r = json.loads((d / "result.json").read_text())
    test.setdefault(d.name.split("-")[0], []).append(selection_ne(r["test"], "tasks"))
    cal = {k: v["calibration"] for k, v in r["test"].items()}
    print(f"{d.name}: {r['flops_per_example'] / 1e6:.3f} MFLOP/example, {r['examples']:,} rows, "
          f"validation NE "
          f"{selection_ne(r['valid'], 'tasks'):.4f}, test NE {selection_ne(r['test'], 'tasks'):.4f}, raw "
          f"calibration pooled {cal['all/click']:.2f} / {cal['all/conversion']:.2f}, cells "
          f"{min(cal.values()):.2f}-{max(cal.values()):.2f}, {r['train_seconds']:.0f} s")
for fam, v in test.items():
    if len(v) > 1:
        mean, half = mean_ci(v)
        print(f"{fam}: test NE {mean:.4f} ± {half:.4f} ({len(v)} seeds)")
for fam in ("dcnv2", "dlrm"):
    if len(test.get("gem", [])) > 1 and len(test.get(fam, [])) > 1:
        print(f"GEM minus {fam}: {format_difference(welch_difference(test['gem'], test[fam]))}")
