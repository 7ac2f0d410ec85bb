"""GEM with the rank-16 cross branch minus GEM without it, per dataset and task, paired by seed (95 % t).

    python compare.py NONE_DIR CROSS_DIR     (lr_compare.py --out folders of the two arms)

Validation NE chooses (the rule every recipe follows); test NE and AUC are reported beside it.
"""
import json
import statistics
import sys
from pathlib import Path

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def ci(d: list[float]) -> str:
    m = statistics.mean(d)
    if len(d) < 2:
        return f"{m:+.4f}"
    h = T975[len(d) - 1] * statistics.stdev(d) / len(d) ** 0.5
    return f"{m:+.4f} [{m - h:+.4f}, {m + h:+.4f}]"


def main() -> None:
    none, cross = Path(sys.argv[1]), Path(sys.argv[2])
    print("| dataset | task | n | valid NE none / cross | cross - none: valid NE | test NE | test AUC |")
    print("|---|---|---|---|---|---|---|")
    for ds_dir in sorted((none / "results").iterdir()):
        pairs = []
        for f in sorted(ds_dir.glob("gem_*_seed*.json")):
            g = cross / "results" / ds_dir.name / f.name
            if g.exists():
                pairs.append((json.loads(f.read_text()), json.loads(g.read_text())))
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
            print(f"| {ds_dir.name} | {t} | {len(pairs)} | {means} | {ci(dv)} | {ci(dt)} | {ci(da)} |")
    fl = [(a["flops_per_example"], b["flops_per_example"], a["steps"], b["steps"]) for a, b in pairs]
    print(f"\nFLOPs/example none / cross, steps (last dataset): {fl[0]}")


if __name__ == "__main__":
    main()
