"""The one-stream study's frontier scored on the study's 16,384 test rows and on the whole test day.

    python compare_onestream.py score OUT/isoflop.json WHOLE_DIR        # each frontier run's whole test day
    python compare_onestream.py score-runs WHOLE_DIR RUN_DIR...          # the same, for the runs named
    python compare_onestream.py report OUT/isoflop.json WHOLE_DIR DATA [PNG] > compare_onestream.txt

``score`` evaluates every frontier run (each budget's chosen size and rate, all its seeds) on the whole test
day (day 7, 800,000 rows) into WHOLE_DIR/NAME.json (skipping those done). ``report``: per budget and family
the size, rate and test NE (mean of pooled click and conversion NE) ± 95 % t on both, GEM minus each baseline
(95 % Welch), the fitted laws and the compute each baseline needs to reach GEM's NE at the largest budget
(bootstrap over seeds; the oracle NE of the whole test day as the floor), and the share of the DLRM -> oracle
gap GEM closes at each budget, on the whole day. Plot: PNG (default frontier_whole_day.png here).
"""
import json
import sys
from pathlib import Path

import numpy as np

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop import run_name, selection_ne
from opengem.bench.isoflop_report import format_difference, format_laws, frontier_laws, welch_difference

FAMILIES = ("gem", "dcnv2", "dlrm")
TEST_DAY = "day=007"


def cells(study: dict, out: Path) -> dict[str, list[tuple[dict, list[Path]]]]:
    """Per family, per budget: the frontier point and its runs' folders (seeds in order)."""
    got = {}
    for fam in FAMILIES:
        got[fam] = []
        for b, p in enumerate(study["frontier"][fam]):
            runs = [out / "runs" / run_name(fam, p["size"], b, p["lr"], s) for s in range(p["seeds"])]
            got[fam].append((p, runs))
    return got


def score_runs(whole: Path, runs: list[Path]) -> None:
    from opengem.train.evaluate import evaluate_run

    whole.mkdir(parents=True, exist_ok=True)
    for d in runs:
        dest = whole / f"{d.name}.json"
        if dest.exists() or not (d / "result.json").exists():
            continue
        (d / "calibration.json").unlink(missing_ok=True)  # raw, as the study scores
        res = evaluate_run(d, partitions=TEST_DAY, write=False)
        ne = selection_ne(res["metrics"], "tasks")
        doc = {"run": str(d), "test": {"rows": res["rows"], "ne": ne, "metrics": res["metrics"]}}
        dest.write_text(json.dumps(doc, indent=2))
        print(d.name, doc["test"]["ne"], flush=True)


def score(study_json: Path, whole: Path) -> None:
    study = json.loads(study_json.read_text())
    pts = cells(study, study_json.parent).values()
    score_runs(whole, [d for cell in pts for _, runs in cell for d in runs])


def report(study_json: Path, whole: Path, data: Path, png: Path) -> None:
    from opengem.bench.scaling_plot import plot_isoflop
    from opengem.bench.size_ladder import oracle_with_totals

    study = json.loads(study_json.read_text())
    budgets = [f"{c:.3g}" for c in study["budgets"]]
    pts = cells(study, study_json.parent)
    slice_ne = {f: [p["ne_seeds"] for p, _ in pts[f]] for f in FAMILIES}
    day_ne = {f: [[json.loads((whole / f"{d.name}.json").read_text())["test"]["ne"] for d in runs]
                  for _, runs in pts[f]] for f in FAMILIES}
    print(f"test NE (mean of pooled click and conversion NE), 95 % t; {study['train_rows']} training rows; "
          f"study oracle (16,384 rows) {study['oracle_ne']:.4f}")
    print(f"{'budget':>8} {'family':6} {'size':>4} {'rate':>6} {'rows':>9}  {'16,384 test rows':>22}  "
          f"{'whole test day':>22}")
    for b, budget in enumerate(budgets):
        for f in FAMILIES:
            p = pts[f][b][0]
            (m1, h1), (m2, h2) = mean_ci(slice_ne[f][b]), mean_ci(day_ne[f][b])
            print(f"{budget:>8} {f:6} {p['size']:>4} {p['lr']:>6g} {p['examples']:>9}  "
                  f"{m1:.4f} ± {h1:.4f} ({p['seeds']})  {m2:.4f} ± {h2:.4f} ({len(day_ne[f][b])})")
    print()
    for b, budget in enumerate(budgets):
        for f in FAMILIES[1:]:
            for what, t in (("16,384 rows", slice_ne), ("whole day", day_ne)):
                print(f"{budget}: GEM minus {f}, {what}: "
                      f"{format_difference(welch_difference(t['gem'][b], t[f][b]))}")
    oracle = oracle_with_totals(data, TEST_DAY)
    floor = float(np.mean([oracle["all/click"], oracle["all/conversion"]]))
    for what, t in (("16,384 rows (the study's floor)", slice_ne), ("whole day", day_ne)):
        points = {f: [(pts[f][b][0]["train_flops"], t[f][b]) for b in range(len(budgets))] for f in FAMILIES}
        base = study["oracle_ne"] if what.startswith("16") else floor
        fits, table = frontier_laws(points, base, "gem", 1000)
        print(f"\nlaws and efficiency, {what}:")
        print(format_laws(fits, table, "GEM", budgets[-1]))
        if what == "whole day":
            plotted = {f: [dict(zip(("train_flops", "ne", "ne_ci95"), (c, *mean_ci(n)))) for c, n in p]
                       for f, p in points.items()}
            laws = {f: law.to_dict() for f, law in fits.items() if law}
            plot_isoflop({"frontier": plotted, "fits": laws, "oracle_ne": floor, "metric": "tasks"}, [], png)
    print(f"\nwhole test day: oracle NE {floor:.4f}; share of the DLRM -> oracle gap GEM closes:")
    for b, budget in enumerate(budgets):
        g, d = float(np.mean(day_ne["gem"][b])), float(np.mean(day_ne["dlrm"][b]))
        print(f"  {budget}: {(d - g) / (d - floor):.1%} (DLRM {d:.4f}, GEM {g:.4f})")


if __name__ == "__main__":
    mode, study_json, whole = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    if mode == "score-runs":
        score_runs(study_json, [Path(p) for p in sys.argv[3:]])
    elif mode == "score":
        score(study_json, whole)
    else:
        png = Path(sys.argv[5]) if len(sys.argv) > 5 else Path(__file__).parent / "frontier_whole_day.png"
        report(study_json, whole, Path(sys.argv[4]), png)
