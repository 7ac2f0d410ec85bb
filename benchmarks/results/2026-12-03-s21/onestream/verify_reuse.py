"""Which run folders under OUT/runs the study would reuse: opengem.bench.isoflop.finished_run, the study's
own check (each result.json written for the resolved config this study builds for its name and for its
evaluation), so that runs copied in from sessions 19-20 under this study's names are the same training, not
a relabelling.

    python verify_reuse.py STUDY_TOML OUT DATA [OVERRIDE...]
"""
import re
import sys
from pathlib import Path
from typing import Any

from opengem.bench.isoflop import (
    _batch_size,
    finished_run,
    load_isoflop_config,
    plan_grid,
    prepare_study,
)


def study_runs(argv: list[str]) -> tuple[Any, Any, list[tuple[Path, Any]]]:
    """(study config, Study, [(run folder, the resolved config the study builds for it)]) for
    ``STUDY_TOML OUT DATA [OVERRIDE...]``; also what adopt_s19.py walks."""
    cfg = load_isoflop_config(argv[0])
    out, data = Path(argv[1]), argv[2]
    st = prepare_study(cfg, out, data, argv[3:], lambda m: None)
    plan = plan_grid(cfg.budgets, st.fwd, _batch_size(st), st.train_rows, cfg.min_steps, cfg.max_epochs)
    cell = {(p.family, p.size, p.budget): p for p in plan}
    fams = {f.name: f for f in cfg.families}
    runs = []
    for d in sorted((out / "runs").iterdir()):
        m = re.fullmatch(r"(\w+)-s(\d+)-b(\d+)-lr([\d.e-]+)-seed(\d+)", d.name)
        fam, size, b, lr, seed = m[1], int(m[2]), int(m[3]), float(m[4]), int(m[5])
        runs.append((d, st.run_config(fams[fam], size, cell[(fam, size, b)].steps, lr, seed)))
    return cfg, st, runs


if __name__ == "__main__":
    cfg, st, runs = study_runs(sys.argv[1:])
    bad = 0
    for d, rc in runs:
        ok = finished_run(rc, d, st.test_spec, cfg.eval_rows, cfg.calibrate) is not None
        bad += not ok
        print(f"{d.name:32} {'reused' if ok else 'DIFFERS (would retrain)'}")
    sys.exit(1 if bad else 0)
