"""Pilot (session 26): does a budget's run do better reading the latest rows it affords than the study's
random sample of row groups from every training day? The simulator's feature-cross weights rotate day by day
(``drift_rad_per_day``, concept drift), and the study scores on day 7 a model whose training rows are spread
evenly over days 0-5. A production ranker with a fixed training budget trains on the most recent window. Each
cell below is trained again exactly as the default study trains it (``configs/isoflop.toml``: rows, steps,
rate, seed, Platt calibration on the validation slice, 16,384-row test slice), except that its training
partitions are the latest whole days that hold its rows (day 5 for <= 800k rows, days 4-5 for <= 1.6M, ...).

    python run_recency.py STUDY_OUT DATA PILOT_OUT CELL...      (CELL = family:size:budget:lr, seeds 0-2)
    python run_recency.py --one STUDY_OUT DATA PILOT_OUT family size budget lr seed     (one run; internal)
"""
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DAY_ROWS = 800_000  # the default stream: 6.4M rows over 8 days


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
    rc = st.run_config(fam, size, p.steps, lr, seed)
    days = sorted(st.train_spec.split(","))
    n_days = -(-p.examples // DAY_ROWS)
    rc.data.train = ",".join(days[-n_days:])
    rc.validate()
    name = run_name(family, size, budget, lr, seed)
    rec, _ = train_and_test(rc, Path(out) / "runs" / name, st.test_spec, cfg.eval_rows, cfg.calibrate)
    rec["train_spec"] = rc.data.train
    (Path(out) / "runs" / name / "recency.json").write_text(json.dumps(rec, indent=1))


def main(argv: list[str]) -> None:
    if argv[0] == "--one":
        s, d, o, fam, size, b, lr, seed = argv[1:]
        return one(s, d, o, fam, int(size), int(b), float(lr), int(seed))
    study_out, data, out, *cells = argv
    jobs = [(*c.split(":"), seed) for c in cells for seed in range(3)]
    os.makedirs(f"{out}/logs", exist_ok=True)

    def run(job: tuple) -> None:
        fam, size, b, lr, seed = job
        log = f"{out}/logs/{fam}-s{size}-b{b}-lr{lr}-seed{seed}.txt"
        with open(log, "w") as fh:
            code = subprocess.call([sys.executable, __file__, "--one", study_out, data, out, fam, size, b, lr,
                                    str(seed)], stdout=fh, stderr=subprocess.STDOUT)
        print(fam, size, b, lr, seed, "exit", code, flush=True)

    with ThreadPoolExecutor(int(os.environ.get("PILOT_WORKERS", "2"))) as pool:
        list(pool.map(run, jobs))


if __name__ == "__main__":
    main(sys.argv[1:])
