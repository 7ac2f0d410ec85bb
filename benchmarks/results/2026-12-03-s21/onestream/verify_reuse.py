"""Which run folders under OUT/runs the study would reuse: each one's result.json must carry the SHA-256 of
the resolved config this study builds for its name (as opengem.bench.isoflop.train_and_test checks), so
that runs copied in from sessions 19-20 under this study's names are the same training, not a relabelling.

    python verify_reuse.py STUDY_TOML OUT DATA [OVERRIDE...]
"""
import hashlib
import json
import re
import sys
from pathlib import Path

from opengem.bench.isoflop import _batch_size, load_isoflop_config, plan_grid, prepare_study
from opengem.config import to_dict

cfg = load_isoflop_config(sys.argv[1])
out, data = Path(sys.argv[2]), sys.argv[3]
st = prepare_study(cfg, out, data, sys.argv[4:], lambda m: None)
plan = plan_grid(cfg.budgets, st.fwd, _batch_size(st), st.train_rows, cfg.min_steps, cfg.max_epochs)
cell = {(p.family, p.size, p.budget): p for p in plan}
fams = {f.name: f for f in cfg.families}
bad = 0
for d in sorted((out / "runs").iterdir()):
    m = re.fullmatch(r"(\w+)-s(\d+)-b(\d+)-lr([\d.e-]+)-seed(\d+)", d.name)
    fam, size, b, lr, seed = m.group(1), int(m.group(2)), int(m.group(3)), float(m.group(4)), int(m.group(5))
    rc = st.run_config(fams[fam], size, cell[(fam, size, b)].steps, lr, seed)
    ident = hashlib.sha256(json.dumps(to_dict(rc), sort_keys=True, default=str).encode()).hexdigest()
    rec = json.loads((d / "result.json").read_text()) if (d / "result.json").exists() else {}
    ok = rec.get("config_sha256") == ident
    bad += not ok
    print(f"{d.name:32} {'reused' if ok else 'DIFFERS (would retrain)'}")
sys.exit(1 if bad else 0)
