"""Extra seeds of a family at the largest budget at another learning rate, through the study's own code
(same resolved run config, training and evaluation as `opengem scale --design isoflop`). Session 12's copy of
session 10's script: its own output folder, and it simulates the study's stream when the folder has none.

    python extra_seeds.py FAMILY LR SEEDS [BUDGET]   e.g. dcnv2 0.003 1,2   (BUDGET: index, default the last)
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

fam_name, lr, seeds = sys.argv[1], float(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")]
out = Path("/work/s12/iso/out")
cfg = load_isoflop_config(default_config_path("default"), families=[fam_name])
data = (out / "data") if (out / "data" / "_COMPLETE").exists() else None  # None: simulate the stream once
st = prepare_study(cfg, out, data, [], lambda m: print(m, flush=True), False)
plan = plan_grid(cfg.budgets, st.fwd, _batch_size(st), st.train_rows, cfg.min_steps, cfg.max_epochs)
last = int(sys.argv[4]) if len(sys.argv) > 4 else len(cfg.budgets) - 1
fam = next(f for f in cfg.families if f.name == fam_name)
size = 0
p = next(q for q in plan if q.family == fam_name and q.size == size and q.budget == last)
for seed in seeds:
    name = run_name(fam_name, size, last, lr, seed)
    rec, trained = train_and_test(st.run_config(fam, size, p.steps, lr, seed), out / "runs" / name,
                                  st.test_spec, cfg.eval_rows)
    print(name, "trained" if trained else "reused", "valid", rec["valid"]["all/click"]["ne"], flush=True)
