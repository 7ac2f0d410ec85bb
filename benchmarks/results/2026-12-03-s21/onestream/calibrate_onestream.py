"""The one-stream study's frontier runs (both size rules), each calibrated on its own validation day (Platt
per surface x task, ``opengem calibrate``), then scored on the whole test day raw and calibrated: issue 14's
calibration bands (pooled within [0.95, 1.05], every surface x task cell within [0.85, 1.15]) and the
calibrated NE. As ``../../2026-12-03-s20/calibrate_frontier.py`` does; the validation day is the run's
``data.eval`` (day 6).

    SHARD=0/2 python calibrate_onestream.py run OUT STUDY_JSON...   # OUT/NAME.json per frontier run
    python calibrate_onestream.py summary OUT STUDY_JSON...         # per study: the table and GEM minus each
"""
import json
import os
import sys
from pathlib import Path

from compare_onestream import FAMILIES, cells

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop import selection_ne
from opengem.bench.isoflop_report import format_difference, welch_difference

TEST = "day=007"


def frontier(study_json: Path) -> list[tuple[int, str, list[Path]]]:
    return [(b, f, runs) for f, pts in cells(json.loads(study_json.read_text()), study_json.parent).items()
            for b, (_, runs) in enumerate(pts)]


def run_one(out: Path, d: Path) -> None:
    from opengem.train.calibrate import calibrate_run
    from opengem.train.evaluate import evaluate_run

    dest = out / f"{d.name}.json"
    if dest.exists():
        return
    (d / "calibration.json").unlink(missing_ok=True)
    raw = evaluate_run(d, partitions=TEST, write=False)
    fit = calibrate_run(d, method="platt")
    cal = evaluate_run(d, partitions=TEST, write=False)
    (d / "calibration.json").unlink(missing_ok=True)  # leave the run raw, as the study scores it
    dest.write_text(json.dumps({"run": str(d), "rows": raw["rows"], "raw": raw["metrics"],
                                "calibrated": cal["metrics"], "fit_partitions": fit.get("partitions"),
                                "fit_rows": fit.get("rows")}, indent=2))
    print(d.name, flush=True)


def summary(out: Path, study_json: Path) -> None:
    budgets = [f"{c:.3g}" for c in json.loads(study_json.read_text())["budgets"]]
    print(f"{study_json}: whole test day; NE = mean of pooled click and conversion NE, 95 % t")
    print("budget   family  run                        NE raw            NE Platt          pooled raw  "
          "pooled Platt  cells raw  cells Platt")
    cal = {}
    for b, f, runs in frontier(study_json):
        docs = [json.loads((out / f"{d.name}.json").read_text()) for d in runs]

        def rng(kind: str, pooled: bool, docs: list = docs) -> str:
            v = [m["calibration"] for doc in docs for k, m in doc[kind].items()
                 if k.startswith("all/") == pooled and m.get("calibration") is not None]
            return f"{min(v):.2f}-{max(v):.2f}"

        ne = {k: [selection_ne(doc[k], "tasks") for doc in docs] for k in ("raw", "calibrated")}
        cal[(b, f)] = ne["calibrated"]
        (r, rh), (c, ch) = mean_ci(ne["raw"]), mean_ci(ne["calibrated"])
        print(f"{budgets[b]:8} {f:6}  {runs[0].name[:-6]:26} {r:.4f} ± {rh:.4f}  {c:.4f} ± {ch:.4f}  "
              f"{rng('raw', True):10}  {rng('calibrated', True):12}  {rng('raw', False):9}  "
              f"{rng('calibrated', False)}")
    print("GEM minus each family, calibrated NE (95 % Welch):")
    for b, budget in enumerate(budgets):
        for f in FAMILIES[1:]:
            diff = welch_difference(cal[(b, "gem")], cal[(b, f)])
            print(f"  {budget}: minus {f} {format_difference(diff)}")


if __name__ == "__main__":
    mode, out, studies = sys.argv[1], Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]]
    out.mkdir(parents=True, exist_ok=True)
    if mode == "run":
        runs = sorted({d for s in studies for _, _, rs in frontier(s) for d in rs})
        shard, of = (int(x) for x in os.environ.get("SHARD", "0/1").split("/"))  # SHARD=i/n: every n-th run
        for d in runs[shard::of]:
            run_one(out, d)
    else:
        for s in studies:
            summary(out, s)
            print()
