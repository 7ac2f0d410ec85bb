"""GEM with the rank-16 cross branch minus GEM without it, per dataset and task, paired by seed (95 % t).

    .venv/bin/python compare.py NONE_DIR CROSS_DIR     (lr_compare.py --out folders of the two arms)

Validation NE chooses (the rule every recipe follows); test NE and AUC are reported beside it. Two epoch rules
from the same runs: the harness's (the epoch of best validation AUC, its ``valid``/``test``) and the epoch of
lowest validation NE (from the per-epoch history, which scores test after every epoch), as lr_compare.py.
"""
import json
import statistics
import sys
from pathlib import Path

from opengem.bench.fit import mean_ci


def ci(d: list[float]) -> str:
    m, h = mean_ci(d)
    if len(d) < 2:
        return f"{m:+.4f}"
    return f"{m:+.4f} [{m - h:+.4f}, {m + h:+.4f}]"


def by_ne(r: dict) -> dict:
    """The run with ``valid``/``test`` taken at its epoch of lowest validation NE (mean over all/ tasks)."""
    def mean_ne(h: dict) -> float:
        m = h["valid"]["metrics"]
        return statistics.mean(v["ne"] for k, v in m.items() if k.startswith("all/"))
    best = min(r["history"], key=mean_ne)
    return {**r, "valid": best["valid"], "test": best["test"]}


def main() -> None:
    none, cross = Path(sys.argv[1]), Path(sys.argv[2])
    print("| dataset | epoch rule | task | n | valid NE none / cross | cross - none: valid NE | test NE "
          "| test AUC |")
    print("|---|---|---|---|---|---|---|---|")
    for ds_dir, rule in [(d, r) for d in sorted((none / "results").iterdir()) for r in ("auc", "ne")]:
        pairs = []
        for f in sorted(ds_dir.glob("gem_*_seed*.json")):
            g = cross / "results" / ds_dir.name / f.name
            if g.exists():
                a, b = json.loads(f.read_text()), json.loads(g.read_text())
                pairs.append((by_ne(a), by_ne(b)) if rule == "ne" else (a, b))
        if not pairs:
            continue
        tasks = [k for k in pairs[0][0]["test"]["metrics"] if k.startswith("all/")]
        for t in tasks:
            def get(r: dict, split: str, m: str, t: str = t) -> float:
                return r[split]["metrics"][t][m]
            vn = [get(a, "valid", "ne") for a, _ in pairs]
            vc = [get(b, "valid", "ne") for _, b in pairs]
            dv = [c - n for n, c in zip(vn, vc)]
            dt = [get(b, "test", "ne") - get(a, "test", "ne") for a, b in pairs]
            da = [get(b, "test", "auc") - get(a, "test", "auc") for a, b in pairs]
            means = f"{statistics.mean(vn):.4f} / {statistics.mean(vc):.4f}"
            diffs = " | ".join(ci(d) for d in (dv, dt, da))
            print(f"| {ds_dir.name} | {rule} | {t} | {len(pairs)} | {means} | {diffs} |")


if __name__ == "__main__":
    main()
