"""Seed-spread probe (session 30): why do GEM's (and DIN's) seeds scatter so at the small budgets?

Each cell is trained by the study's own worker (``opengem.bench.isoflop_worker``: the study's rows, steps,
latest days, Platt on the validation slice, 16,384-row test slice) under a named variant (a list of --set
overrides, empty = the study's own recipe), seeds 0..N-1, into OUT/<variant>/runs/.

    python probe.py run STUDY_TOML DATA OUT VARIANT CELL... [--seeds N] [--first F] [--set k=v ...]
    python probe.py table OUT          (valid / test NE mean, sd and range per cell and variant)

CELL = family:size:budget:lr. PROBE_WORKERS runs at once (default 2). ``--first F`` (session 34): seeds
F..F+N-1, to confirm a change on seeds it was not chosen on.
"""
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def run(study: str, data: str, out: Path, variant: str, cells: list[str], seeds: int,
        sets: list[str], first: int = 0) -> None:
    vout = out / variant
    (vout / "logs").mkdir(parents=True, exist_ok=True)
    (vout / "variant.json").write_text(json.dumps({"overrides": sets}))
    jobs = [(*c.split(":"), str(s)) for s in range(first, first + seeds) for c in cells]

    def one(job: tuple) -> None:
        with open(vout / "logs" / f"{'-'.join(job)}.txt", "w") as fh:
            args = [sys.executable, "-m", "opengem.bench.isoflop_worker", study, str(vout), data, *job, *sets]
            code = subprocess.call(args, stdout=fh, stderr=subprocess.STDOUT)
        print(variant, *job, "exit", code, flush=True)

    with ThreadPoolExecutor(int(os.environ.get("PROBE_WORKERS", "2"))) as pool:
        list(pool.map(one, jobs))


def ne(rec: dict, split: str) -> float:
    m = rec[split]
    return (m["all/click"]["ne"] + m["all/conversion"]["ne"]) / 2


def table(out: Path) -> None:
    print("| cell | variant | seeds | valid NE mean (sd) | test NE mean (sd) | test min .. max |")
    print("|---|---|---|---|---|---|")
    rows = {}
    for f in sorted(out.glob("*/runs/*/result.json")):
        variant = f.parents[2].name
        cell, seed = f.parent.name.rsplit("-seed", 1)
        rec = json.loads(f.read_text())
        rows.setdefault((cell, variant), []).append((int(seed), ne(rec, "valid"), ne(rec, "test")))
    for (cell, variant), runs in sorted(rows.items()):
        v = [r[1] for r in runs]
        t = [r[2] for r in runs]
        sd = (lambda x: statistics.stdev(x) if len(x) > 1 else float("nan"))
        print(f"| {cell} | {variant} | {len(runs)} | {statistics.mean(v):.4f} ({sd(v):.4f}) | "
              f"{statistics.mean(t):.4f} ({sd(t):.4f}) | {min(t):.4f} .. {max(t):.4f} |")


if __name__ == "__main__":
    a = sys.argv[1:]
    if a[0] == "table":
        table(Path(a[1]))
    else:
        seeds, first, sets, rest = 5, 0, [], []
        it = iter(a[1:])
        for x in it:
            if x == "--seeds":
                seeds = int(next(it))
            elif x == "--first":
                first = int(next(it))
            elif x == "--set":
                sets.append(next(it))
            else:
                rest.append(x)
        study, data, out, variant, *cells = rest
        run(study, data, Path(out), variant, cells, seeds, sets, first)
