"""Adopt session 19's 5e11 runs (copied into OUT/runs under this study's names) whose resolved config
differs from the one this study builds only by the keys session 20 added with their defaults
(``model.gem.cross_layers = 0``, ``model.gem.cross_rank = 0``: no cross branch, no parameters, the same
model). Every other key must be equal; the run's result.json then gets this study's config SHA-256 (its old
one kept as ``config_sha256_before``).

That the code change is neutral for these models is checked separately: the same 1.58e10 cells (GEM, DCNv2,
DLRM size 0, seed 0, 3e-3) trained by session 19's code (commit dfbc737) and by today's give identical
metrics (``eqcheck.txt``).

    python adopt_s19.py STUDY_TOML OUT DATA [OVERRIDE...]
"""
import json
import sys
import tomllib

from verify_reuse import study_runs

from opengem.bench.isoflop import config_sha256
from opengem.config import flatten_dict, to_dict

NEW_KEYS = {"model.gem.cross_layers": 0, "model.gem.cross_rank": 0}
_cfg, _st, runs = study_runs(sys.argv[1:])
for d, rc in runs:
    want = to_dict(rc)
    ident = config_sha256(rc)
    res = d / "result.json"
    rec = json.loads(res.read_text())
    if rec.get("config_sha256") == ident:
        continue
    have = flatten_dict(tomllib.loads((d / "config.toml").read_text()))
    new = flatten_dict(json.loads(json.dumps(want, default=str)))
    extra = {k: v for k, v in new.items() if k not in have}
    diff = {k for k in have if have[k] != new.get(k)}
    if extra == NEW_KEYS and not diff:
        rec["config_sha256_before"], rec["config_sha256"] = rec["config_sha256"], ident
        res.write_text(json.dumps(rec, indent=2))
        print(f"{d.name}: adopted (differs only by {sorted(extra)} at their defaults)")
    else:
        print(f"{d.name}: NOT adopted: new keys {extra}, differing {sorted(diff)}")
