"""Score runs on the WHOLE validation and test days (the study scored the first 16,384 rows of each).

    python whole_days.py score OUT RUN_DIR...    # OUT/NAME.json per run (skips those done)
    python whole_days.py choose OUT > whole_days.txt

``choose``: per budget and family, the finalists of ``compare_s20.py`` (the three sizes with the lowest
seed-0 validation NE on the study's 16,384 rows, at the budget's rate) ranked again by the mean over seeds 0-2
of their whole-day validation NE, and the chosen size's whole-day test NE over its seeds; then GEM minus
each baseline (95 % Welch). NE = mean of pooled click and conversion NE, raw (no calibration).
"""
import json
import re
import sys
from pathlib import Path

import numpy as np

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop import selection_ne
from opengem.bench.isoflop_report import format_difference, welch_difference

NAME = re.compile(r"(gem|dcnv2|dlrm)-s(\d+)-b(\d)-lr([0-9.e-]+)-seed(\d+)$")
DAYS = {"valid": "day=006", "test": "day=007"}
# the finalists compare_s20.py lists (budget -> family -> (rate, sizes)); session 19's choice first
FINALISTS = {
    0: {"gem": ("0.01", (10, 13, 9)), "dcnv2": ("0.01", (11, 14, 12)), "dlrm": ("0.01", (14, 13, 8))},
    1: {"gem": ("0.003", (13, 10, 9)), "dcnv2": ("0.003", (11, 14, 12)), "dlrm": ("0.003", (14, 10, 13))},
    # GEM's s5 (session 18) was built by the code before session 19's pyramid fix: it cannot be rebuilt
    2: {"gem": ("0.01", (10, 13)), "dcnv2": ("0.003", (9, 12, 7)), "dlrm": ("0.003", (8, 10, 6))},
}
LABEL = {0: "5e10", 1: "1.58e11", 2: "5e11"}



def score(out: Path, runs: list[Path]) -> None:
    from opengem.train.evaluate import evaluate_run

    for d in runs:
        dest = out / f"{d.name}.json"
        if dest.exists() or not (d / "result.json").exists():
            continue
        (d / "calibration.json").unlink(missing_ok=True)  # raw, as the study scores
        doc = {"run": str(d)}
        for key, spec in DAYS.items():
            res = evaluate_run(d, partitions=spec, write=False)
            ne = selection_ne(res["metrics"], "tasks")
            doc[key] = {"rows": res["rows"], "ne": ne, "metrics": res["metrics"]}
        dest.write_text(json.dumps(doc, indent=2))
        print(d.name, doc["valid"]["ne"], doc["test"]["ne"], flush=True)


def choose(out: Path) -> None:
    docs = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}

    def seeds(f: str, s: int, b: int, lr: str) -> dict[int, dict]:
        got = {}
        for name, doc in docs.items():
            m = NAME.match(name)
            if m and (m[1], int(m[2]), int(m[3]), m[4]) == (f, s, b, lr):
                got[int(m[5])] = doc
        return got

    for b, fams in FINALISTS.items():
        print(f"== {LABEL[b]}")
        test = {}
        for f, (lr, sizes) in fams.items():
            means = {}
            for s in sizes:
                got = seeds(f, s, b, lr)
                v = [got[k]["valid"]["ne"] for k in (0, 1, 2) if k in got]
                if v:
                    means[s] = (float(np.mean(v)), len(v))
            if not means:
                continue
            chosen = min(means, key=lambda s: means[s][0])
            ranked = sorted(means.items(), key=lambda kv: kv[1])
            print(f"  {f} at {lr}: whole-day validation NE, mean over seeds 0-2: "
                  + ", ".join(f"s{s} {m:.4f} ({n})" for s, (m, n) in ranked))
            for s in sizes:
                got = seeds(f, s, b, lr)
                if got:
                    t = [got[k]["test"]["ne"] for k in sorted(got)]
                    mean, half = mean_ci(t) if len(t) > 1 else (t[0], float("nan"))
                    mark = "  <- chosen" if s == chosen else ""
                    print(f"    s{s}: whole-day test NE {mean:.4f} ± {half:.4f} ({len(t)} seeds){mark}")
            got = seeds(f, chosen, b, lr)
            test[f] = [got[k]["test"]["ne"] for k in sorted(got)]
        for other in ("dcnv2", "dlrm"):
            if len(test.get("gem", [])) > 1 and len(test.get(other, [])) > 1:
                print(f"  GEM minus {other}: {format_difference(welch_difference(test['gem'], test[other]))}")


def finalist_runs(roots: list[Path]) -> list[Path]:
    """Every run folder of a finalist (seeds 0-4), 1.58e11 first, then 5e11, then 5e10."""
    runs = []
    for b in (1, 2, 0):
        for f, (lr, sizes) in FINALISTS[b].items():
            for s in sizes:
                for k in range(5):
                    for root in roots:
                        d = root / f"{f}-s{s}-b{b}-lr{lr}-seed{k}"
                        if d.exists() and d not in runs:
                            runs.append(d)
    return runs


if __name__ == "__main__":
    mode, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    if mode == "score":
        score(out, finalist_runs([Path(p) for p in sys.argv[3:]]))
    else:
        choose(out)
