"""Two iso-FLOP studies' choices and frontiers side by side: per family and budget the chosen rate and size,
the frontier's test NE (mean over its seeds, 95 % t interval) and the efficiency ratio against GEM.

    python compare_choices.py OLD/isoflop.json NEW/isoflop.json [OLD_LABEL NEW_LABEL]
"""

import json
import sys


def main(old_path: str, new_path: str, labels: tuple[str, str]) -> None:
    old, new = (json.load(open(p)) for p in (old_path, new_path))
    a, b = labels
    print(f"{'family':<7} {'C':>9}  {a + ' lr/size':>16} {a + ' NE':>18}  {b + ' lr/size':>16} "
          f"{b + ' NE':>18}  {'moved':>5}")
    for fam in new["frontier"]:
        for p, q in zip(old["frontier"][fam], new["frontier"][fam], strict=True):
            moved = "" if (p["lr"], p["size"]) == (q["lr"], q["size"]) else "*"
            print(f"{fam:<7} {q['flops_budget']:9.3g}  {p['lr']:>10g} / s{p['size']:<3} "
                  f"{p['ne']:.4f} +-{p['ne_ci95']:.4f}  {q['lr']:>10g} / s{q['size']:<3} "
                  f"{q['ne']:.4f} +-{q['ne_ci95']:.4f}  {moved:>5}")
    ref = new["efficiency_reference"]
    print(f"\ncompute each baseline needs to reach {ref}'s frontier NE, as a multiple of {ref}'s budget")
    for fam, rows in new["efficiency"].items():
        for r, s in zip(old["efficiency"][fam], rows, strict=True):
            def fmt(x: dict) -> str:
                lo, hi = x.get("ci95") or (None, None)
                ratio = x.get("ratio")
                if ratio is None:
                    return "-"
                return f"{ratio:.3g}x [{lo if lo is None else format(lo, '.3g')}, " \
                       f"{hi if hi is None else format(hi, '.3g')}]"
            print(f"  {fam:<7} C={s['c_ref']:.3g}: {a} {fmt(r)}   {b} {fmt(s)}")
    print(f"\nDLRM -> oracle gap closed at the largest budget ({a} / {b})")
    for fam in new["gap_closed_vs_dlrm"]:
        g, h = old["gap_closed_vs_dlrm"][fam][-1], new["gap_closed_vs_dlrm"][fam][-1]
        print(f"  {fam:<7} " + "  ".join(f"{k} {g[k]:.1%} / {h[k]:.1%}" for k in h))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], tuple(sys.argv[3:5]) if len(sys.argv) > 4 else ("old", "new"))
