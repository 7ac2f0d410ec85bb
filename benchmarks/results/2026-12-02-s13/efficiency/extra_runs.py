"""Runs of a family at one budget and learning rate, each ladder's s0, through the study's own code (same
resolved run config, training and evaluation as `opengem scale --design isoflop`), into session 12's study
folder (its 2.8M-row stream and runs). Session 12's extra_seeds.py with the folder as an argument.

    python extra_runs.py OUT FAMILY LR SEEDS BUDGET     e.g. /work/s12/iso/out dcnv2 0.001 0 3
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

out = Path(sys.argv[1])
fam_name, lr, seeds = sys.argv[2], float(sys.argv[3]), [int(s) for s in sys.argv[4].split(",")]
cfg = load_isoflop_config(default_config_path("default"), families=[fam_name])
data = (out / "data") if (out / "data" / "_COMPLETE").exists() else None  # None: simulate the stream once
st = prepare_study(cfg, out, data, [], lambda m: print(m, flush=True), False)
plan = plan_grid(cfg.budgets, st.fwd, _batch_size(st), st.train_rows, cfg.min_steps, cfg.max_epochs)
last = int(sys.argv[5])
fam = next(f for f in cfg.families if f.name == fam_name)
size = 0
p = next(q for q in plan if q.family == fam_name and q.size == size and q.budget == last)
for seed in seeds:
    name = run_name(fam_name, size, last, lr, seed)
    rec, trained = train_and_test(st.run_config(fam, size, p.steps, lr, seed), out / "runs" / name,
                                  st.test_spec, cfg.eval_rows)
    print(name, "trained" if trained else "reused", "valid", rec["valid"]["all/click"]["ne"], flush=True)
