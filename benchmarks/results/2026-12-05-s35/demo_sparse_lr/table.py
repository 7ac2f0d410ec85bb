"""run.sh's runs: validation (day 5) and test (day 6) NE, all/click and all/conversion and their mean.

    python table.py OUT
"""
import json
import sys
from pathlib import Path


def ne(rec: dict, split: str, task: str) -> float:
    return rec[split]["metrics"][f"all/{task}"]["ne"]


print("| run | dense lr | sparse lr | steps | valid click | valid conversion | valid mean | test click | "
      "test conversion |")
print("|---|---|---|---|---|---|---|---|---|")
for p in sorted(Path(sys.argv[1]).glob("*.json")):
    r = json.loads(p.read_text())
    v = [ne(r, "valid", t) for t in ("click", "conversion")]
    t = [ne(r, "test", t) for t in ("click", "conversion")]
    print(f"| {p.stem} | {r['lr']:g} | {r['sparse_lr']:g} | {r['steps']} | {v[0]:.4f} | {v[1]:.4f} | "
          f"{sum(v) / 2:.4f} | {t[0]:.4f} | {t[1]:.4f} |")
