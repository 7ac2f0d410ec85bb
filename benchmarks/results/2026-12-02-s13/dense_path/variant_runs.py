"""GEM runs of the iso-FLOP study (each ladder's s0, the study's own code) with extra model overrides, on
session 12's stream, into their own folder: does a wider dense-feature path let GEM learn messaging's
hour-of-day conversion pattern (calibrate/README.md)? Rows still follow the budget (the plan counts the
overridden model's FLOPs).

    python variant_runs.py OUT DATA LR SEEDS BUDGET OVERRIDE...
    e.g. python variant_runs.py /work/s13/dense/h32 /work/s12/iso/out/data 0.003 3,4,5 2 \
             model.embedding.dense_hidden=32
"""
import sys
from pathlib import Path

from opengem.bench.isoflop import (
    _batch_size,
    default_config_path,
    load_isoflop_config,
    plan_grid,
    prepare_study,
    run_name,
    train_and_test,
)

out, data = Path(sys.argv[1]), Path(sys.argv[2])
lr, seeds, budget = float(sys.argv[3]), [int(s) for s in sys.argv[4].split(",")], int(sys.argv[5])
extra = sys.argv[6:]
cfg = load_isoflop_config(default_config_path("default"), families=["gem"])
st = prepare_study(cfg, out, data, extra, lambda m: print(m, flush=True), False)
plan = plan_grid(cfg.budgets, st.fwd, _batch_size(st), st.train_rows, cfg.min_steps, cfg.max_epochs)
fam = cfg.families[0]
p = next(q for q in plan if q.family == "gem" and q.size == 0 and q.budget == budget)
for seed in seeds:
    name = run_name("gem", 0, budget, lr, seed)
    rec, trained = train_and_test(st.run_config(fam, 0, p.steps, lr, seed), out / "runs" / name, st.test_spec,
                                  cfg.eval_rows)
    print(name, "trained" if trained else "reused", rec["examples"], "rows", flush=True)
