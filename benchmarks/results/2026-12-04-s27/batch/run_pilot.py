"""Pilot (session 27): does GEM, behind DCNv2 at the latest-window study's small budgets, need more steps?

Each cell is trained as the study trains it (its isoflop.toml: rows, dense rate, seed, latest days, Platt on
the validation slice, 16,384-row slices) but at batch 128 instead of 256: the same rows and FLOPs in twice the
optimizer steps. Batch 256 is the study's own run.

    python run_pilot.py STUDY_OUT DATA PILOT_OUT CELL...   (CELL = family:size:budget:lr; seeds 0-2)
    python run_pilot.py --one STUDY_OUT DATA PILOT_OUT family size budget lr seed      (internal)
"""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BATCH = 128


def one(study_out: str, data: str, out: str, family: str, size: int, budget: int, lr: float, seed: int
        ) -> None:
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
    rc = st.run_config(fam, size, p.examples // BATCH, lr, seed)  # the same rows, twice the steps
    rc.data.batch_size = BATCH
    rc.validate()
    train_and_test(rc, Path(out) / "runs" / f"{run_name(family, size, budget, lr, seed)}-bs{BATCH}",
                   st.test_spec, cfg.eval_rows, cfg.calibrate)


def main(argv: list[str]) -> None:
    if argv[0] == "--one":
        s, d, o, fam, size, b, lr, seed = argv[1:]
        return one(s, d, o, fam, int(size), int(b), float(lr), int(seed))
    study_out, data, out, *cells = argv
    jobs = [(*c.split(":"), str(seed)) for c in cells for seed in range(3)]
    os.makedirs(f"{out}/logs", exist_ok=True)

    def run(job: tuple) -> None:
        log = f"{out}/logs/{'-'.join(job)}.txt"
        with open(log, "w") as fh:
            code = subprocess.call([sys.executable, __file__, "--one", study_out, data, out, *job],
                                   stdout=fh, stderr=subprocess.STDOUT)
        print(*job, "exit", code, flush=True)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(run, jobs))


if __name__ == "__main__":
    main(sys.argv[1:])
