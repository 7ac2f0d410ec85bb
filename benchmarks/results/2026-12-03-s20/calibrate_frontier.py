"""Session 19's frontier runs, each calibrated on its own validation day (Platt per surface x task,
``opengem calibrate``), then scored on the whole test day raw and calibrated (issue 14's calibration bands:
pooled within [0.95, 1.05], every surface x task cell within [0.85, 1.15]).

The study scored each run on the test day's first 16,384 rows; here the whole day is scored (about 350k
rows on the 2.8M-row stream, 800k on the 6.4M-row one), so test-row noise is smaller than in the frontier
table. The validation day is the run's ``data.eval`` (day 6), never its training days, and never the test
day.

    python calibrate_frontier.py run OUT NAME...   # per run: OUT/NAME.json (skips those done)
    python calibrate_frontier.py summary OUT       # the table, from OUT/*.json

A run is named ``STREAM:family-sSIZE-bBUDGET-lrRATE-seedN`` where STREAM is ``lad`` (the 2.8M-row stream)
or ``b3`` (the 6.4M-row stream); FRONTIER lists the cells session 19 reported and where their folders are.
"""
import json
import sys
from pathlib import Path

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop import selection_ne
from opengem.bench.isoflop_report import format_difference, welch_difference

TEST = "day=007"
# (stream, budget label, family, size, budget index, rate, seeds, runs folder): session 19's frontier cells
FRONTIER = [
    ("lad", "5e10", "gem", 10, 0, "0.01", 3, "/work/s19/lad/runs"),
    ("lad", "5e10", "dcnv2", 11, 0, "0.01", 3, "/work/s19/lad/runs"),
    ("lad", "5e10", "dlrm", 14, 0, "0.003", 3, "/work/s19/lad/runs"),
    ("lad", "1.58e11", "gem", 13, 1, "0.003", 5, "/work/s19/lad/runs"),
    ("lad", "1.58e11", "dcnv2", 11, 1, "0.003", 5, "/work/s19/lad/runs"),
    ("lad", "1.58e11", "dlrm", 14, 1, "0.003", 5, "/work/s19/lad/runs"),
    ("lad", "5e11", "gem", 10, 2, "0.01", 5, "/work/s19/lad/runs"),
    ("lad", "5e11", "dcnv2", 9, 2, "0.003", 5, "/work/s18/lad/runs"),
    ("lad", "5e11", "dlrm", 8, 2, "0.003", 5, "/work/s18/lad/runs"),
    ("lad", "1.58e11", "gem", 17, 1, "0.003", 5, "/work/s20/cross/runs"),  # session 20: GEM + cross branch
    ("b3", "5e11", "gem", 17, 2, "0.003", 3, "/work/s20/cross_b3/runs"),  # session 20: GEM + cross
    ("b3", "5e11", "gem", 10, 2, "0.01", 3, "/work/s19/b3/runs"),
    ("b3", "5e11", "dcnv2", 9, 2, "0.003", 3, "/work/s19/b3/runs"),
    ("b3", "5e11", "dlrm", 14, 2, "0.003", 3, "/work/s19/b3/runs"),
]
TASKS = ("click", "conversion")


def names() -> list[str]:
    return [f"{st}:{f}-s{s}-b{b}-lr{lr}-seed{k}" for st, _, f, s, b, lr, n, _ in FRONTIER for k in range(n)]


def folder(name: str) -> Path:
    stream, run = name.split(":")
    for st, _, f, s, b, lr, _n, root in FRONTIER:
        if st == stream and run.startswith(f"{f}-s{s}-b{b}-lr{lr}-"):
            return Path(root) / run
    raise SystemExit(f"{name}: not a frontier run")


def run_one(out: Path, name: str) -> None:
    from opengem.train.calibrate import calibrate_run
    from opengem.train.evaluate import evaluate_run

    dest = out / f"{name.replace(':', '__')}.json"
    if dest.exists():
        return
    d = folder(name)
    (d / "calibration.json").unlink(missing_ok=True)  # raw first, whatever an earlier attempt left
    raw = evaluate_run(d, partitions=TEST, write=False)
    fit = calibrate_run(d, method="platt")
    cal = evaluate_run(d, partitions=TEST, write=False)
    doc = {"run": str(d), "rows": raw["rows"], "raw": raw["metrics"], "calibrated": cal["metrics"],
           "fit_partitions": fit.get("partitions"), "fit_rows": fit.get("rows"), "oracle": raw.get("oracle")}
    dest.write_text(json.dumps(doc, indent=2))
    print(name, raw["rows"], "rows", flush=True)


def ne_tasks(m: dict) -> float:
    return selection_ne(m, "tasks")


def summary(out: Path) -> None:
    docs = {p.stem.replace("__", ":"): json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}
    print("stream  budget   family  size  seeds  test rows  NE raw            NE calibrated     "
          "pooled cal raw  pooled cal Platt  cells raw    cells Platt")
    for st, label, f, s, b, lr, n, _ in FRONTIER:
        got = [docs[k] for k in (f"{st}:{f}-s{s}-b{b}-lr{lr}-seed{i}" for i in range(n)) if k in docs]
        if not got:
            continue

        def rng(kind: str, pooled: bool, got: list = got) -> str:
            v = [m["calibration"] for d in got for k, m in d[kind].items()
                 if k.startswith("all/") == pooled and m.get("calibration") is not None]
            return f"{min(v):.2f}-{max(v):.2f}"

        def ne(kind: str, got: list = got) -> str:
            m, h = mean_ci([ne_tasks(d[kind]) for d in got])
            return f"{m:.4f} ± {h:.4f}"

        print(f"{st:6}  {label:7}  {f:6}  s{s:<3}  {len(got)}/{n}    {got[0]['rows']:>9,}  {ne('raw'):16}  "
              f"{ne('calibrated'):16}  {rng('raw', True):14}  {rng('calibrated', True):16}  "
              f"{rng('raw', False):11}  {rng('calibrated', False)}")
    print("\nGEM minus each family on the whole test day (calibrated NE; 95 % Welch interval over seeds):")
    for st, label in (("lad", "5e10"), ("lad", "1.58e11"), ("lad", "5e11"), ("b3", "5e11")):
        per = {}
        for s_, lb, f, s, b, lr, n, _ in FRONTIER:
            if (s_, lb) == (st, label):
                per[(f, s)] = [ne_tasks(docs[k]["calibrated"]) for k in
                               (f"{st}:{f}-s{s}-b{b}-lr{lr}-seed{i}" for i in range(n)) if k in docs]
        for (f, s), gem in per.items():
            if f != "gem" or len(gem) < 2:
                continue
            for (other, so), xs in per.items():
                if other != "gem" and len(xs) > 1:
                    diff = format_difference(welch_difference(gem, xs))
                    print(f"  {st} {label}: GEM s{s} minus {other} s{so} {diff}")


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "names":
        print("\n".join(names()))
        raise SystemExit(0)
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    if mode == "run":
        for nm in sys.argv[3:] or names():
            run_one(out, nm)
    else:
        summary(out)
