"""Summary of scoring_ab.sh: seconds per run before and after, and whether the scores agree.

    python scoring_ab_summary.py OUT_DIR
"""

import json
import statistics
import sys
from pathlib import Path


def main(out: str) -> None:
    recs = {v: [json.loads(x) for x in (Path(out) / f"{v}.jsonl").read_text().splitlines()]
            for v in ("old", "new")}
    for v, rs in recs.items():
        print(f"{v}: {len(rs)} scorings, {sum(r['seconds'] for r in rs):.1f} s, "
              f"median {statistics.median(r['seconds'] for r in rs):.2f} s a run")
    old, new = (sum(r["seconds"] for r in recs[v]) for v in ("old", "new"))
    print(f"new / old: {new / old:.3f}")
    by = {v: {r["run"]: r for r in rs} for v, rs in recs.items()}
    for key in ("valid_ne", "raw_ne", "test_ne"):
        diff = max(abs(by["new"][n][key] - by["old"][n][key]) for n in by["new"])
        print(f"largest |new - old| {key} (all/click): {diff:.2e}")


if __name__ == "__main__":
    main(sys.argv[1])
