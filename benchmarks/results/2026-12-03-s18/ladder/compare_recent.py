"""Session 17's frontier at 5e10, 1.58e11 and 5e11 against ladders extended with sizes that read only each
history's most recent events (``model.embedding.seq_recent``), chosen by the study's rule.

Session 17's sizes (0-4) come from its committed outputs: seed-0 validation NE per size at each budget's
rate (``../../2026-12-03-s17/ladder/isoflop_runs.csv`` for 5e10 and 1.58e11; the "Seed-0 validation NE" lines
of ``../../2026-12-03-s17/compare.txt`` for 5e11) and the chosen cells' seeds (that CSV at 5e10;
``five_seeds_b1.txt`` / ``five_seeds_b2.txt`` there at 1.58e11 and 5e11). Session 18's sizes (5+) come
from run folders (``NAME/result.json``), written to ``runs_s18.csv`` here. Per budget and family, the size
with the lowest seed-0 validation NE at the budget's rate is chosen (the study's rule); its seeds' test NE
(mean of pooled click and conversion NE on the test day's first 16,384 rows) make the point; then GEM minus
each family (95 % Welch), raw calibration of the chosen cells' seeds run here, and the share of the
DLRM -> oracle gap GEM closes (the oracle NE of session 17's study on the same stream and test slice).

    python compare_recent.py RUN_DIR [RUN_DIR ...] > compare_recent.txt
"""
import csv
import json
import re
import sys
from pathlib import Path

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop import selection_ne
from opengem.bench.isoflop_report import format_difference, welch_difference

FAMILIES = ("gem", "dcnv2", "dlrm")
BUDGETS = {0: "5e10", 1: "1.58e11", 2: "5e11"}
RATE = {(0, f): 0.01 for f in FAMILIES} | {(1, f): 0.003 for f in FAMILIES} | {
    (2, "gem"): 0.01, (2, "dcnv2"): 0.003, (2, "dlrm"): 0.003}  # each budget's rate, as session 17 chose
NAME = re.compile(r"(\w+)-s(\d+)-b(\d+)-lr([0-9.e-]+)-seed(\d+)$")
here = Path(__file__).resolve().parent
s17 = here.parents[1] / "2026-12-03-s17"

# valid[(budget, family, size)] = seed-0 validation NE at the budget's rate; test[...] = {seed: test NE}
oracle = json.loads((s17 / "ladder" / "isoflop.json").read_text())["oracle_ne"]  # the same stream and slice
valid: dict[tuple[int, str, int], float] = {}
test: dict[tuple[int, str, int], dict[int, float]] = {}
with open(s17 / "ladder" / "isoflop_runs.csv") as fh:
    for r in csv.DictReader(fh):
        b, f, s, seed = int(r["budget"]), r["family"], int(r["size"]), int(r["seed"])
        if float(r["lr"]) != RATE[(b, f)]:
            continue
        if seed == 0:
            valid[(b, f, s)] = float(r["valid_ne"])
        test.setdefault((b, f, s), {})[seed] = float(r["test_ne"])
for line in (s17 / "compare.txt").read_text().splitlines():  # "  b2 gem: s3@0.01 0.8137, s0@0.01 0.8139, ..."
    m = re.match(r"\s+b2 (\w+): (s\d+@.*)$", line)
    if m:
        for cell in m[2].split(", "):
            size, rate, ne = re.match(r"s(\d+)@([0-9.]+) ([0-9.]+)", cell).groups()
            if float(rate) == RATE[(2, m[1])]:
                valid[(2, m[1], int(size))] = float(ne)
for b, fname, sizes in ((1, "five_seeds_b1.txt", {"gem": 1, "dcnv2": 4, "dlrm": 0}),
                        (2, "five_seeds_b2.txt", {"gem": 3, "dcnv2": 0, "dlrm": 4})):
    for line in (s17 / "ladder" / fname).read_text().splitlines():
        m = re.match(r"(\w+): .*\(seeds (.*)\)", line)
        if m:
            test[(b, m[1], sizes[m[1]])] = {i: float(x) for i, x in enumerate(m[2].split(", "))}

rows = []


def run_row(d: Path) -> dict | None:
    """One run folder NAME/result.json as a CSV row (None when it is not a finished study run)."""
    m = NAME.match(d.name)
    if not m or not (d / "result.json").exists():
        return None
    r = json.loads((d / "result.json").read_text())
    cal = {k: v["calibration"] for k, v in r["test"].items()}
    return {"name": d.name, "family": m[1], "size": int(m[2]), "budget": int(m[3]), "lr": float(m[4]),
            "seed": int(m[5]), "flops_per_example": r["flops_per_example"], "examples": r["examples"],
            "train_seconds": round(r["train_seconds"], 1),
            "valid_ne": selection_ne(r["valid"], "tasks"),
            "test_ne": selection_ne(r["test"], "tasks"),
            "test_cal_all_click": cal["all/click"], "test_cal_all_conversion": cal["all/conversion"],
            "test_cal_cells_min": min(cal.values()), "test_cal_cells_max": max(cal.values())}


def print_gap_and_differences(ne: dict[str, list[float]], oracle: float) -> None:
    """The share of the DLRM -> oracle gap GEM closes, and GEM minus each baseline (95 % Welch)."""
    dlrm, gem = sum(ne["dlrm"]) / len(ne["dlrm"]), sum(ne["gem"]) / len(ne["gem"])
    print(f"  GEM closes {100 * (dlrm - gem) / (dlrm - oracle):.1f} % of the DLRM -> oracle gap "
          f"({dlrm:.4f} -> {oracle:.4f})")
    for f in FAMILIES[1:]:
        if len(ne["gem"]) > 1 and len(ne[f]) > 1:
            print(f"  GEM minus {f}: {format_difference(welch_difference(ne['gem'], ne[f]))}")


def report(b: int, label: str, exclude: frozenset = frozenset()) -> None:
    """One budget: each family's chosen size ((family, size) in ``exclude`` left out), its seeds, the
    differences."""
    print(f"== {label}")
    chosen = {}
    for f in FAMILIES:
        ranked = sorted((ne, s) for (bb, ff, s), ne in valid.items()
                        if bb == b and ff == f and (f, s) not in exclude)
        print(f"  seed-0 validation NE, {f} at {RATE[(b, f)]}: "
              + ", ".join(f"s{s} {ne:.4f}" for ne, s in ranked))
        chosen[f] = ranked[0][1]
    ne = {}
    for f in FAMILIES:
        seeds = test.get((b, f, chosen[f]), {})
        ne[f] = [seeds[k] for k in sorted(seeds)]
        mean, half = mean_ci(ne[f]) if len(ne[f]) > 1 else (ne[f][0], float("nan"))
        print(f"  {f}: s{chosen[f]} test NE {mean:.4f} ± {half:.4f} ({len(ne[f])} seeds: "
              + ", ".join(f"{x:.4f}" for x in ne[f]) + ")")
    for f in FAMILIES:
        cell = (b, f, chosen[f], RATE[(b, f)])
        cal = [r for r in rows if (r["budget"], r["family"], r["size"], r["lr"]) == cell]
        if cal:
            pooled = [r[k] for r in cal for k in ("test_cal_all_click", "test_cal_all_conversion")]
            lo, hi = min(r["test_cal_cells_min"] for r in cal), max(r["test_cal_cells_max"] for r in cal)
            print(f"  {f} calibration (raw, {len(cal)} seeds): pooled {min(pooled):.2f}-{max(pooled):.2f}, "
                  f"cells {lo:.2f}-{hi:.2f}")
    print_gap_and_differences(ne, oracle)


# at 5e11 these read some of the 2.1M training rows twice (ladder_recent_5e11.toml)
MORE_THAN_ONE_PASS = frozenset({("dcnv2", 5), ("dcnv2", 6), ("dcnv2", 9), ("dlrm", 5), ("dlrm", 8)})


def main() -> None:
    """Read RUN_DIRs (argv), write runs_s18.csv, print every budget's report."""
    for folder in sys.argv[1:]:
        for d in sorted(Path(folder).iterdir()):
            row = run_row(d)
            if row is None:
                continue
            rows.append(row)
            fam, size, b, lr, seed = row["family"], row["size"], row["budget"], row["lr"], row["seed"]
            if lr != RATE[(b, fam)]:
                continue
            if seed == 0:
                valid[(b, fam, size)] = rows[-1]["valid_ne"]
            test.setdefault((b, fam, size), {})[seed] = rows[-1]["test_ne"]
    with open(here / "runs_s18.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)

    for b, label in BUDGETS.items():
        report(b, label)
    report(2, "5e11, one pass only (the sizes that read some rows twice left out)", MORE_THAN_ONE_PASS)


if __name__ == "__main__":
    main()
