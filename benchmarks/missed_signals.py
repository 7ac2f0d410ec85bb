"""Which simulated signals a trained model misses: its click logit beside the simulator's true terms.

    .venv/bin/python benchmarks/missed_signals.py RUN [RUN ...] [--day N] [--cache DIR]

``benchmarks/sim_learnability.py`` says how much NE each kind of signal is worth to a predictor that knows it;
this says how much of it a trained model has NOT learned. For each run, on the test day of the stream it
trained on (a simulated dataset: its summary.json holds the simulator's config, so the day's chunks are
regenerated with the click logit's named terms, and the rows checked label for label against the dataset):
a per-surface logistic regression on the model's click logit alone (its recalibration), then on the logit
plus the true values of one group of terms. What adding a group gains is the part of that signal the model
missed; "all learnable" adds every term but the per-id ones (which need many rows per id). Fitted on the
day's first half, scored on its second half (NE, click, all surfaces pooled).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_learnability import GROUPS, fit_logistic, ne  # noqa: E402

PER_ID = GROUPS["per-id (id_latent, user_bias, ad_bias)"]


def day_terms(data: Path, day: int, cache: Path | None) -> dict[str, np.ndarray]:
    """The simulator's click terms, labels, true probability and surface of every row of ``day``, in the
    dataset's row order (regenerated chunk by chunk; cached as npz when ``cache`` is given)."""
    from opengem.data.sim_config import SimConfig
    from opengem.data.sim_core import World, chunk_plan, generate_chunk

    summary = json.loads((data / "summary.json").read_text())
    cfg = SimConfig.from_dict(summary["config"])
    tag = hashlib.sha256(f"{data.resolve()}|{day}".encode()).hexdigest()[:16]
    key = cache / f"terms-{tag}.npz" if cache else None
    if key is not None and key.exists():
        return dict(np.load(key))
    world = World(cfg)
    cols: dict[str, list[np.ndarray]] = {}
    for i, (d, r0, r1) in enumerate(chunk_plan(cfg)):
        if d != day:
            continue
        ch = generate_chunk(world, d, r0, r1, i)
        parts = {"y": ch.click.astype(np.float64), "p": ch.p_click, "surface": ch.columns["surface"],
                 **{f"t_{k}": v for k, v in ch.click_terms.items()}}
        for k, v in parts.items():
            cols.setdefault(k, []).append(np.asarray(v))
    out = {k: np.concatenate(v) for k, v in cols.items()}
    if key is not None:
        key.parent.mkdir(parents=True, exist_ok=True)
        np.savez(key, **out)
    return out


def model_logits(run: Path, spec: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, Path]:
    """(click logit, click label, surface) of the run's model on ``spec`` (uncalibrated), and its data."""
    from opengem.train.calibrate import collect_logits
    from opengem.train.data import make_loader
    from opengem.train.evaluate import open_run

    with open_run(run, calibrated=False) as r:
        z, y, m, s = collect_logits(r.model, make_loader(r.ds, spec, r.cfg.data, train=False), r.device)
        click = r.ds.schema.task_names.index("click")
        return z[:, click], y[:, click], s, r.data_path


def report(run: Path, day: int, cache: Path | None) -> None:
    z, y, s, data = model_logits(run, f"day={day:03d}")
    t = day_terms(data, day, cache)
    if len(t["y"]) != len(y) or not np.array_equal(t["y"], y) or not np.array_equal(t["surface"], s):
        raise SystemExit(f"{run}: the regenerated day {day} does not match the dataset row for row")
    names = [k[2:] for k in t if k.startswith("t_")]
    half = len(y) // 2
    tr, te = slice(0, half), slice(half, None)
    n_surf = int(s.max()) + 1

    def fit(cols: list[np.ndarray]) -> float:
        x = np.stack(cols, 1)
        return ne(fit_logistic(x[tr], s[tr], y[tr], x[te], s[te], n_surf), y[te])

    learnable = [t[f"t_{k}"] for k in names if k not in PER_ID]
    base = fit([z])
    print(f"\n{run}  (day {day}: {len(y):,} rows, fitted on the first half, scored on the second)")
    print(f"  {'predictor':<62}{'NE':>8}{'gain':>9}")
    print(f"  {'oracle (true probability)':<62}{ne(t['p'][te], y[te]):>8.4f}")
    print(f"  {'all learnable true terms, no model (the ceiling)':<62}{fit(learnable):>8.4f}")
    print(f"  {'model logit (recalibrated per surface)':<62}{base:>8.4f}")
    rows = [("model + all learnable terms", learnable)]
    rows += [(f"model + {g}", [t[f"t_{k}"] for k in keys]) for g, keys in GROUPS.items()]
    rows += [(f"model + {k}", [t[f"t_{k}"]]) for k in names]
    for label, cols in rows:
        v = fit([z, *cols])
        print(f"  {label:<62}{v:>8.4f}{v - base:>+9.4f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--day", type=int, default=None, help="the day to score (default: the stream's last)")
    p.add_argument("--cache", type=Path, default=None, help="folder to keep the regenerated terms in")
    args = p.parse_args(argv)
    for run in args.runs:
        day = args.day
        if day is None:
            from opengem.train.config import load_run_config

            data = Path(load_run_config(run / "config.toml").data.path)
            day = int(json.loads((data / "summary.json").read_text())["config"]["days"]) - 1
        report(run, day, args.cache)
    return 0


if __name__ == "__main__":
    sys.exit(main())
