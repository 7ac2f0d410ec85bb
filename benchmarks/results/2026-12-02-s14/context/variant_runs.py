"""Runs of the iso-FLOP study's plan (the study's own code: rows follow the budget for the overridden model)
for one family, size, budget, rate and seeds, with extra model overrides, into their own folder.

    python variant_runs.py OUT DATA FAMILY SIZE BUDGET LR SEEDS OVERRIDE...
    e.g. python variant_runs.py /work/s14/ctx/gem /work/s12/iso/out/data gem 0 2 0.003 3,4,5 \
             model.head.context=time
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

out, data, family = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
size, budget, lr = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
seeds, extra = [int(s) for s in sys.argv[7].split(",")], sys.argv[8:]
cfg = load_isoflop_config(default_config_path("default"), families=[family])
st = prepare_study(cfg, out, data, extra, lambda m: print(m, flush=True), False)
plan = plan_grid(cfg.budgets, st.fwd, _batch_size(st), st.train_rows, cfg.min_steps, cfg.max_epochs)
fam = cfg.families[0]
p = next(q for q in plan if q.family == family and q.size == size and q.budget == budget)
for seed in seeds:
    name = run_name(family, size, budget, lr, seed)
    rec, trained = train_and_test(st.run_config(fam, size, p.steps, lr, seed), out / "runs" / name,
                                  st.test_spec, cfg.eval_rows)
    print(name, "trained" if trained else "reused", rec["examples"], "rows", flush=True)
