"""Markdown tables of an iso-FLOP study's isoflop.json: the frontier per family and budget (size, rate, test
NE with its 95 % t interval, the runs' own 16,384-row slice beside when the frontier was scored again, pooled
and per-cell calibration), then GEM minus every other family (Welch), the fitted laws, the efficiency ratios.

    python tables.py STUDY/isoflop.json
"""

from __future__ import annotations

import json
import sys

import numpy as np


def _ratio(x: dict) -> str:
    def g(v: float | None) -> str:
        return "never" if v is None or v != v else f"{v:.3g}"

    lo, hi = x.get("ci95") or (None, None)
    return f"{g(x.get('ratio'))}x [{g(lo)}, {g(hi)}]"


def main(path: str) -> None:
    r = json.load(open(path))
    budgets = r["budgets"]
    print("| family | C | size | MFLOP/ex | rows | lr | test NE (95 %) | slice NE | cal click / conv "
          "| cells |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for fam, fr in r["frontier"].items():
        for p in fr:
            cal = p["calibration"]
            rng = cal["cell_range"]
            own = p.get("ne_own_test")
            slice_ne = f"{np.mean(own):.4f}" if own else "-"
            print(f"| {fam} | {p['flops_budget']:.3g} | s{p['size']} | {p['fwd_flops'] / 1e6:.3f} | "
                  f"{p['examples']:,} | {p['lr']:g} | {p['ne']:.4f} ± {p['ne_ci95']:.4f} | {slice_ne} | "
                  f"{cal['pooled'].get('all/click', float('nan')):.3f} / "
                  f"{cal['pooled'].get('all/conversion', float('nan')):.3f} | {rng[0]:.2f}-{rng[1]:.2f} |")
    ref = r["efficiency_reference"]
    print(f"\n{ref} minus each family (< 0: {ref} better; 95 % Welch; * excludes 0)\n")
    print("| family | " + " | ".join(f"{b:.3g}" for b in budgets) + " |")
    print("|---|" + "---|" * len(budgets))
    for fam, ds in r["difference_vs_reference"].items():
        cells = []
        for d in ds:
            lo, hi = d["ci95"]
            cells.append(f"{d['diff']:+.4f} [{lo:+.4f}, {hi:+.4f}]{' *' if d['excludes_zero'] else ''}")
        print(f"| {fam} | " + " | ".join(cells) + " |")
    print("\nfitted laws (NE = a C^-b + c):")
    for fam, f in r["fits"].items():
        print(f"  {fam}: " + ("-" if f is None else f"a {f['a']:.4g}, b {f['b']:.4f}, c {f['c']:.5f}"))
    print("\ncompute each family needs to reach GEM's frontier NE, over GEM's (95 % bootstrap):")
    for fam, rows in r["efficiency"].items():
        print(f"  {fam}: " + "; ".join(_ratio(x) for x in rows))
    gap = r.get("gap_closed_vs_dlrm") or {}
    if ref in gap:
        print(f"\nshare of the DLRM -> oracle gap {ref} closes (click / conversion): " + "; ".join(
            f"{g.get('all/click', float('nan')):.1%} / {g.get('all/conversion', float('nan')):.1%}"
            for g in gap[ref]))
    print(f"\nruns {r['runs']}, trained now {r['runs_trained_now']}, elapsed {r['elapsed_s']:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1])
