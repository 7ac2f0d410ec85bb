"""Pilot (session 27): is the embedding tables' learning rate what holds GEM back at the small budgets?

Every iso-FLOP run tunes its dense learning rate on validation but trains its embedding tables (TorchRec's
fused row-wise Adagrad) at the recipe's fixed ``train.sparse_lr`` (0.2). With 100k-330k rows from one day, the
tables see few updates per id, so that rate may matter, and differently per family. Each cell below is trained
exactly as the latest-window default study trains it (its isoflop.toml: rows, steps, dense rate, seed, latest
days, Platt on the validation slice, 16,384-row test slice) except ``train.sparse_lr``; sparse_lr 0.2 is the
study's own run.

    python run_pilot.py STUDY_OUT DATA PILOT_OUT SPARSE_LRS CELL...  (CELL = family:size:budget:lr, seeds 0-2)
    python run_pilot.py --one STUDY_OUT DATA PILOT_OUT family size budget lr seed sparse_lr   (internal)
    python run_pilot.py --table STUDY_OUT PILOT_OUT                  (the table: valid / test NE per cell)
"""
import json
import os
import subprocess
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np


def one(study_out: str, data: str, out: str, family: str, size: int, budget: int, lr: float, seed: int,
        sparse_lr: float) -> None:
    from opengem.bench.isoflop import (
        _batch_size,
        load_isoflop_config,
        plan_grid,
        prepare_study,
        train_and_test,
    )
    from opengem.bench.isoflop_rule import run_name

    cfg = load_isoflop_config(Path(study_out) / "isoflop.toml")
    st = prepare_study(cfg, Path(out), data, [], print)
    plan = plan_grid(cfg.budgets, st.fwd, _batch_size(st), st.train_rows, cfg.min_steps, cfg.max_epochs)
    p = next(q for q in plan if (q.family, q.size, q.budget) == (family, size, budget))
    fam = next(f for f in cfg.families if f.name == family)
    rc = st.run_config(fam, size, p.steps, lr, seed)
    rc.train.sparse_lr = sparse_lr
    rc.validate()
    name = f"{run_name(family, size, budget, lr, seed)}-slr{sparse_lr:g}"
    rec, _ = train_and_test(rc, Path(out) / "runs" / name, st.test_spec, cfg.eval_rows, cfg.calibrate)
    (Path(out) / "runs" / name / "pilot.json").write_text(json.dumps(rec, indent=1))


def ne(rec: dict, split: str) -> float:
    m = rec[split]
    return (m["all/click"]["ne"] + m["all/conversion"]["ne"]) / 2


def table(study_out: str, out: str) -> None:
    cells: dict[str, dict[float, dict[int, tuple[float, float]]]] = defaultdict(lambda: defaultdict(dict))
    for f in sorted(Path(out, "runs").glob("*/pilot.json")):
        name, slr = f.parent.name.rsplit("-slr", 1)
        cell, seed = name.rsplit("-seed", 1)
        rec = json.loads(f.read_text())
        cells[cell][float(slr)][int(seed)] = (ne(rec, "valid"), ne(rec, "test"))
    for cell, by in cells.items():  # sparse_lr 0.2: the study's own runs
        for seed in range(3):
            b = Path(study_out, "runs", f"{cell}-seed{seed}", "result.json")
            if b.exists():
                rec = json.loads(b.read_text())
                by[0.2].setdefault(seed, (ne(rec, "valid"), ne(rec, "test")))
    print("| cell | sparse_lr | seeds | valid NE (mean) | test NE (slice, mean) | test minus sparse_lr 0.2 "
          "(paired) |")
    print("|---|---|---|---|---|---|")
    for cell, by in cells.items():
        for slr in sorted(by):
            seeds = sorted(by[slr])
            v = np.array([by[slr][s] for s in seeds])
            both = [s for s in seeds if s in by[0.2]]
            d = np.array([by[slr][s][1] - by[0.2][s][1] for s in both])
            diff = f"{d.mean():+.4f} ({len(d)} seeds)" if slr != 0.2 and len(d) else ""
            print(f"| {cell} | {slr:g} | {len(seeds)} | {v[:, 0].mean():.4f} | {v[:, 1].mean():.4f} "
                  f"| {diff} |")


def main(argv: list[str]) -> None:
    if argv[0] == "--one":
        s, d, o, fam, size, b, lr, seed, slr = argv[1:]
        return one(s, d, o, fam, int(size), int(b), float(lr), int(seed), float(slr))
    if argv[0] == "--table":
        return table(argv[1], argv[2])
    study_out, data, out, slrs, *cells = argv
    jobs = [(*c.split(":"), str(seed), slr) for c in cells for slr in slrs.split(",") for seed in range(3)]
    os.makedirs(f"{out}/logs", exist_ok=True)

    def run(job: tuple) -> None:
        fam, size, b, lr, seed, slr = job
        log = f"{out}/logs/{fam}-s{size}-b{b}-lr{lr}-seed{seed}-slr{slr}.txt"
        with open(log, "w") as fh:
            code = subprocess.call([sys.executable, __file__, "--one", study_out, data, out, fam, size, b, lr,
                                    seed, slr], stdout=fh, stderr=subprocess.STDOUT)
        print(fam, size, b, lr, seed, slr, "exit", code, flush=True)

    with ThreadPoolExecutor(int(os.environ.get("PILOT_WORKERS", "1"))) as pool:
        list(pool.map(run, jobs))


if __name__ == "__main__":
    main(sys.argv[1:])
