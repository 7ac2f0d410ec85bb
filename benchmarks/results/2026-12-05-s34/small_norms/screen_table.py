"""Screen table: each variant's validation NE on seeds 0-9 beside the recipe's (session 34).

    python screen_table.py BASE_VARIANT_DIR VARIANT_DIR ...     (probe.py's OUT/<variant> folders)
"""
import glob
import json
import statistics
import sys
from pathlib import Path

from opengem.bench.isoflop import selection_ne


def runs(folder: str) -> dict[int, float]:
    out = {}
    for p in glob.glob(f"{folder}/runs/*/result.json"):
        seed = int(Path(p).parent.name.rsplit("-seed", 1)[1])
        out[seed] = selection_ne(json.loads(Path(p).read_text())["valid"], "tasks")
    return out


base = runs(sys.argv[1])
print("| variant | seeds | valid NE mean (sd) | seeds > 0.85 | minus the recipe, paired | per seed |")
print("|---|---|---|---|---|---|")
for folder in sys.argv[1:]:
    r = runs(folder)
    v = [r[k] for k in sorted(r)]
    d = [r[k] - base[k] for k in sorted(r) if k in base]
    print(f"| {Path(folder).name} | {len(v)} | {statistics.mean(v):.4f} ({statistics.stdev(v):.4f}) | "
          f"{sum(x > 0.85 for x in v)} | {statistics.mean(d):+.4f} | {' '.join(f'{x:.4f}' for x in v)} |")
