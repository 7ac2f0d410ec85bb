"""The iso-FLOP frontier with the history counts beside the one without them, per family and budget: the
size and rate each study chose, test NE (95 % t over the frontier's seeds), and GEM minus each baseline in
both (Welch, as the study's own table).

    python compare.py NO_COUNTS/isoflop.json COUNTS/isoflop.json
"""

from __future__ import annotations

import json
import sys


def _point(p: dict) -> str:
    return f"s{p['size']} lr {p['lr']:g}: {p['ne']:.4f} ± {p['ne_ci95']:.4f}"


def _diff(d: dict) -> str:
    lo, hi = d["ci95"]
    star = "**" if d["excludes_zero"] else ""
    return f"{star}{d['diff']:+.4f} [{lo:+.4f}, {hi:+.4f}]{star}"


def main(before_path: str, after_path: str) -> None:
    before, after = json.load(open(before_path)), json.load(open(after_path))
    budgets = after["budgets"]
    print("| family | C | no counts: size, lr, test NE | counts: size, lr, test NE | counts minus none |")
    print("|---|---|---|---|---|")
    for fam, points in after["frontier"].items():
        old = {p["flops_budget"]: p for p in before["frontier"].get(fam, [])}
        for p in points:
            q = old.get(p["flops_budget"])
            was = _point(q) if q else "-"
            delta = f"{p['ne'] - q['ne']:+.4f}" if q else "-"
            print(f"| {fam} | {p['flops_budget']:.3g} | {was} | {_point(p)} | {delta} |")
    print("\nGEM minus each family, test NE (95 % Welch; bold: excludes 0)\n")
    print("| family | features | " + " | ".join(f"{b:.3g}" for b in budgets) + " |")
    print("|---|---|" + "---|" * len(budgets))
    for fam in after["difference_vs_reference"]:
        for name, r in (("no counts", before), ("counts", after)):
            ds = r["difference_vs_reference"].get(fam)
            if ds:
                print(f"| {fam} | {name} | " + " | ".join(_diff(d) for d in ds) + " |")
    print("\nbudget each family needs to reach GEM's frontier NE, over GEM's (ratio / 95 % bootstrap):")
    for name, r in (("no counts", before), ("counts", after)):
        for fam, rows in r["efficiency"].items():
            cells = []
            for x in rows:
                lo, hi = x.get("ci95") or (None, None)
                cells.append(" / ".join("never" if v is None or v != v else f"{v:.3g}"
                                        for v in (x.get("ratio"), lo, hi)))
            print(f"  {name:9s} {fam:7s} " + "; ".join(cells))
    for name, r in (("no counts", before), ("counts", after)):
        gap = r.get("gap_closed_vs_dlrm", {}).get("gem")
        if gap:
            print(f"share of the DLRM -> oracle gap GEM closes, {name} (click / conversion): " + "; ".join(
                f"{g.get('all/click', float('nan')):.1%} / {g.get('all/conversion', float('nan')):.1%}"
                for g in gap))


if __name__ == "__main__":
    main(*sys.argv[1:3])
