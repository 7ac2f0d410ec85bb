"""GEM with the cross branch (ladder_s20_cross.toml's s15-s17: session 19's s13 plus ``gem.cross_layers``)
against session 19's frontier, on the same stream, budgets, rates and rule.

Per budget: GEM's size is the one with the lowest seed-0 validation NE on the study's 16,384 rows at the
budget's rate, among session 19's sizes AND s15-s17 (the study's rule, with the new sizes offered); DCNv2's
and DLRM's cells are session 19's (its rule, with its rate re-check). Test NE = mean of pooled click and
conversion NE; first on the study's 16,384 test rows, then on the whole test day (``whole_days.py``'s
scores; validation likewise on the whole day 6). GEM minus each baseline with a 95 % Welch interval.

    python compare_cross.py WHOLE_DIR [WHOLE_DIR ...] -- RUN_DIR [RUN_DIR ...] > compare_cross.txt
"""
import json
import runpy
import sys
from pathlib import Path

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop_report import format_difference, welch_difference

here = Path(__file__).resolve().parent
split = sys.argv.index("--")
whole_dirs, run_dirs = [Path(p) for p in sys.argv[1:split]], [Path(p) for p in sys.argv[split + 1:]]
g = runpy.run_path(str(here.parent / "size_seeds" / "compare_s20.py"), run_name="compare_s20")
ne, RATE, BUDGETS, GRID = g["ne"], g["RATE"], g["BUDGETS"], g["g"]["GRID"]
g["load_runs"](run_dirs, here / "runs_cross.csv")
NEW = {"gem": 15, "dcnv2": 16}  # the first size of each family's session-20 sizes
whole = {p.stem: json.loads(p.read_text()) for d in whole_dirs for p in d.glob("*.json")}


def name(b: int, f: str, s: int, lr: float, seed: int) -> str:
    return f"{f}-s{s}-b{b}-lr{lr:g}-seed{seed}"


def point(xs: list[float]) -> str:
    if not xs:
        return "no runs"
    mean, half = mean_ci(xs) if len(xs) > 1 else (xs[0], float("nan"))
    return f"{mean:.4f} ± {half:.4f} ({len(xs)} seeds)"


def cell_of(b: int, f: str, offered: set[int] | None = None) -> tuple[int, float]:
    """(size, rate): lowest seed-0 validation NE at the budget's rate, then the rate re-check."""
    rate = RATE[(b, f)]
    ranked = sorted((v[0][0], s) for (bb, ff, s, lr), v in ne.items()
                    if (bb, ff, lr) == (b, f, rate) and 0 in v and v[0][0] is not None
                    and (offered is None or s in offered))
    size = ranked[0][1]
    tried = [(ne[k][0][0], lr) for lr in GRID if (k := (b, f, size, lr)) in ne and 0 in ne[k]]
    return size, min(tried)[1]


for b, label in BUDGETS.items():
    print(f"== {label}")
    rate = RATE[(b, "gem")]
    cells = {}
    for f in ("gem", "dcnv2"):
        rate = RATE[(b, f)]
        seed0 = sorted((v[0][0], s) for (bb, ff, s, lr), v in ne.items()
                       if (bb, ff, lr) == (b, f, rate) and 0 in v and v[0][0] is not None)
        print(f"  seed-0 validation NE, {f} at {rate:g} (s{NEW[f]} and up: session 20's): "
              + ", ".join(f"s{s} {v:.4f}" for v, s in seed0[:8]))
        cells[f] = cell_of(b, f)
        cells[f"{f} (session 19)"] = cell_of(b, f, {s for _, s in seed0 if s < NEW[f]})
    cells["dlrm"] = cell_of(b, "dlrm")
    test16, testday, validday = {}, {}, {}
    for label_f, (s, lr) in cells.items():
        f = label_f.split()[0]
        got = ne.get((b, f, s, lr), {})
        test16[label_f] = [got[k][1] for k in sorted(got)]
        runs = [whole.get(name(b, f, s, lr, k)) for k in sorted(got)]
        testday[label_f] = [r["test"]["ne"] for r in runs if r]
        validday[label_f] = [r["valid"]["ne"] for r in runs if r]
        print(f"  {label_f:19} s{s} at {lr:g}: test NE (16,384 rows) {point(test16[label_f])}; "
              f"whole test day {point(testday[label_f])}; whole validation day {point(validday[label_f])}")
    for other in ("gem (session 19)", "dcnv2", "dcnv2 (session 19)", "dlrm"):
        for what, t in (("16,384 rows", test16), ("whole day", testday)):
            if len(t["gem"]) > 1 and len(t[other]) > 1 and cells["gem"] != cells[other]:
                diff = format_difference(welch_difference(t["gem"], t[other]))
                print(f"  GEM minus {other}, {what}: {diff}")

print("\n== The whole-day, three-seed rule: each family's three finalists by seed-0 validation NE (16,384 "
      "rows, the budget's rate; new sizes offered), chosen by their mean whole-day validation NE over seeds "
      "0-2, scored on the whole test day")
for b, label in BUDGETS.items():
    print(f"-- {label}")
    test = {}
    for f in ("gem", "dcnv2", "dlrm"):
        rate = RATE[(b, f)]
        seed0 = sorted((v[0][0], s) for (bb, ff, s, lr), v in ne.items()
                       if (bb, ff, lr) == (b, f, rate) and 0 in v and v[0][0] is not None)
        means = {}
        for _, s in seed0[:3]:
            docs = [whole.get(name(b, f, s, rate, k)) for k in (0, 1, 2)]
            if all(docs):
                means[s] = sum(d["valid"]["ne"] for d in docs) / 3
        missing = [s for _, s in seed0[:3] if s not in means]
        if not means:
            print(f"  {f}: no finalist has whole-day scores for seeds 0-2")
            continue
        chosen = min(means, key=means.get)
        got = ne.get((b, f, chosen, rate), {})
        test[f] = [d["test"]["ne"] for k in sorted(got) if (d := whole.get(name(b, f, chosen, rate, k)))]
        ranked = sorted(means.items(), key=lambda kv: kv[1])
        print(f"  {f} at {rate:g}: " + ", ".join(f"s{s} {v:.4f}" for s, v in ranked)
              + (f" (without seeds 0-2 scored: {', '.join(f's{s}' for s in missing)})" if missing else "")
              + f" -> s{chosen}: whole test day {point(test[f])}")
    for other in ("dcnv2", "dlrm"):
        if len(test.get("gem", [])) > 1 and len(test.get(other, [])) > 1:
            print(f"  GEM minus {other}: {format_difference(welch_difference(test['gem'], test[other]))}")
