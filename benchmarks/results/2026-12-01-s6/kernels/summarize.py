"""Per-seed table of repro.sh's runs: final all/click and all/conversion NE on day 5, fused vs reference,
and the paired difference (reference - fused; negative = the reference is better).

Usage: python summarize.py OUT_DIR [OUT_DIR ...]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

TASKS = ("all/click", "all/conversion")


def final_ne(run: Path) -> dict[str, float] | None:
    """The final evaluation's NE per task of one run folder, None while it is unfinished."""
    lines = (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").exists() else []
    for line in reversed(lines):
        rec = json.loads(line)
        if rec.get("kind") == "eval" and rec.get("final"):
            return {t: rec["metrics"][t]["ne"] for t in TASKS}
    return None


def table(out: Path) -> str:
    rows = ["| seed | all/click NE fused / reference | all/conversion NE fused / reference | "
            "conversion reference - fused |", "|---|---|---|---|"]
    gaps = []
    for fused_dir in sorted(out.glob("fused_seed*")):
        seed = fused_dir.name.removeprefix("fused_seed")
        f, r = final_ne(fused_dir), final_ne(out / f"pytorch_seed{seed}")
        if f is None or r is None:
            continue
        gap = r["all/conversion"] - f["all/conversion"]
        gaps.append(gap)
        rows.append(f"| {seed} | {f['all/click']:.4f} / {r['all/click']:.4f} | "
                    f"{f['all/conversion']:.4f} / {r['all/conversion']:.4f} | {gap:+.4f} |")
    if len(gaps) >= 2:
        rows.append(f"| mean (sd) | | | {statistics.mean(gaps):+.4f} ({statistics.stdev(gaps):.4f}) |")
    return "\n".join(rows)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(f"{arg}:\n{table(Path(arg))}\n")
