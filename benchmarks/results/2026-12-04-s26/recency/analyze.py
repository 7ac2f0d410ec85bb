"""The recency pilot beside the study's own runs of the same cells (same rows, steps, rate and seed; only
the training partitions differ): validation and test NE (mean of pooled click and conversion NE; test through
each run's Platt fit, on the study's 16,384-row slices), pooled test calibration, and latest-days minus
random, paired by seed (95 % t).

    python analyze.py STUDY_OUT PILOT_OUT
"""
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from opengem.bench.isoflop import selection_ne

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571}  # Student t, 97.5 %, by degrees of freedom


def main(study: str, pilot: str) -> None:
    cells = defaultdict(dict)
    for f in sorted(Path(pilot).glob("runs/*/recency.json")):
        name = f.parent.name
        base = Path(study) / "runs" / name / "result.json"
        if not base.exists():
            continue
        cell = name.rsplit("-seed", 1)[0]
        cells[cell][name] = (json.loads(base.read_text()), json.loads(f.read_text()))
    print("| cell | days | seeds | valid random / latest | test random / latest | test cal click, conv: "
          "random / latest | latest - random, test [95 %] |")
    print("|---|---|---|---|---|---|---|")
    for cell, runs in cells.items():
        rand = [r for r, _ in runs.values()]
        late = [r for _, r in runs.values()]

        def ne(rs: list, part: str) -> np.ndarray:
            return np.array([selection_ne(r[part], "tasks") for r in rs])

        def cal(rs: list) -> str:
            return "/".join(f"{np.mean([r['test'][k]['calibration'] for r in rs]):.3f}"
                            for k in ("all/click", "all/conversion"))

        d = ne(late, "test") - ne(rand, "test")
        n = len(d)
        half = T975[n - 1] * d.std(ddof=1) / np.sqrt(n) if n > 1 else float("nan")
        lo, hi = d.mean() - half, d.mean() + half
        print(f"| {cell} | {late[0]['train_spec']} | {n} | {ne(rand, 'valid').mean():.4f} / "
              f"{ne(late, 'valid').mean():.4f} | {ne(rand, 'test').mean():.4f} / "
              f"{ne(late, 'test').mean():.4f} | {cal(rand)} / {cal(late)} | "
              f"{d.mean():+.4f} [{lo:+.4f}, {hi:+.4f}] |")


def latest_frontier(pilot: str) -> None:
    """Per budget, the latest-window runs' test NE per family and GEM minus each (95 % Welch-style interval
    with the conservative min(n) - 1 degrees of freedom): the cells are the study's frontier cells."""
    per: dict[str, dict[str, np.ndarray]] = defaultdict(dict)
    for f in sorted(Path(pilot).glob("runs/*/recency.json")):
        fam, _, budget = f.parent.name.split("-")[:3]
        rec = json.loads(f.read_text())
        per[budget].setdefault(fam, np.array([]))
        per[budget][fam] = np.append(per[budget][fam], selection_ne(rec["test"], "tasks"))
    print("\nlatest window, frontier cells: test NE per family; GEM minus each [95 %]")
    for budget, fams in sorted(per.items()):
        line = f"  {budget}: " + ", ".join(f"{k} {v.mean():.4f} (n {v.size})"
                                         for k, v in sorted(fams.items()))
        g = fams.get("gem")
        if g is not None and g.size > 1:
            for k, v in sorted(fams.items()):
                if k == "gem" or v.size < 2:
                    continue
                d = g.mean() - v.mean()
                se = np.sqrt(g.var(ddof=1) / g.size + v.var(ddof=1) / v.size)
                half = T975[min(g.size, v.size) - 1] * se
                line += f"; - {k} {d:+.4f} [{d - half:+.4f}, {d + half:+.4f}]"
        print(line)


if __name__ == "__main__":
    main(*sys.argv[1:3])
    latest_frontier(sys.argv[2])
