"""One line per run of a screen folder: steps, FLOPs/example, validation and test NE (pooled click,
conversion and their mean, the demo's selection metric), the calibration of the pooled cells on the test day.

    python runs_table.py RUNS_FOLDER > table.md
"""

import json
import sys
from pathlib import Path

TASKS = ("all/click", "all/conversion")


def main() -> None:
    print("| run | steps | MFLOP/ex | valid click | valid conv | **valid mean** | test click | test conv "
          "| test cal click / conv |")
    print("|---|---|---|---|---|---|---|---|---|")
    for f in sorted(Path(sys.argv[1]).glob("*.json")):
        r = json.loads(f.read_text())
        v, t = r["valid"]["metrics"], r["test"]["metrics"]
        vals = [v[k]["ne"] for k in TASKS]
        cal = " / ".join(f"{t[k]['calibration']:.3f}" for k in TASKS)
        print(f"| {f.stem} | {r['steps']} | {r['flops_per_example'] / 1e6:.3f} | {vals[0]:.4f} "
              f"| {vals[1]:.4f} | **{sum(vals) / 2:.4f}** | {t[TASKS[0]]['ne']:.4f} "
              f"| {t[TASKS[1]]['ne']:.4f} | {cal} |")


if __name__ == "__main__":
    main()
