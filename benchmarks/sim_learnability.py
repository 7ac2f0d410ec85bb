"""How much NE each kind of simulated signal is worth: the ceiling a model can reach on the small recipe.

    .venv/bin/python benchmarks/sim_learnability.py [--config configs/small.toml] [key=value ...]

The simulator knows every term of the click logit (``sim_core.click_terms``). A logistic regression on
the TRUE values of a subset of terms (per-surface intercepts, one weight per term, fitted on the train
days, scored on the eval day) is the best any model can do with only that kind of signal, so the table
says which part of the oracle NE is reachable from sequences, from feature crosses, and which part
hides in per-id effects (learnable only with many rows per id). Two reference models read only
model-visible columns: "hand features" is a logistic regression on ad category vs the last ``recent_k``
history categories, past engaged events on that category, and ad quality; it is the trivially strong
baseline a trained model should beat.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from opengem.data.sim_config import SimConfig
from opengem.data.sim_core import ENGAGE_ACTIONS
from opengem.data.simulate import iter_batches
from opengem.train.config import load_run_config

GROUPS = {
    "sequence (recent, engaged, affinity)": ["recent", "engaged", "affinity"],
    "feature crosses (cross2, cross3, cat_cross, fmt_bias)": ["cross2", "cross3", "cat_cross", "fmt_bias"],
    "dense (quality, activity)": ["quality", "activity"],
    "topic drift": ["topic_drift"],
    "per-id (id_latent, user_bias, ad_bias)": ["id_latent", "user_bias", "ad_bias"],
}


def ne(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    b = y.mean()
    return float(-(y * np.log(p) + (1 - y) * np.log1p(-p)).mean() / -(b * np.log(b) + (1 - b) * np.log1p(-b)))


def fit_logistic(
    x_tr: np.ndarray, s_tr: np.ndarray, y_tr: np.ndarray, x_te: np.ndarray, s_te: np.ndarray, n_surf: int
) -> np.ndarray:
    """Per-surface intercept + per-surface weights, full-batch L-BFGS; returns test probabilities."""
    X, S, Y = torch.tensor(x_tr), torch.tensor(s_tr), torch.tensor(y_tr)
    W = torch.zeros(n_surf, X.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(n_surf, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([W, b], max_iter=300, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits((X * W[S]).sum(1) + b[S], Y)
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        Xe, Se = torch.tensor(x_te), torch.tensor(s_te)
        return torch.sigmoid((Xe * W[Se]).sum(1) + b[Se]).numpy()


def collect(cfg: SimConfig) -> dict[str, np.ndarray]:
    cols: dict[str, list[np.ndarray]] = {}
    for sb in iter_batches(cfg):
        ch = sb.chunk
        c = ch.columns
        off = ch.offsets["hist__category"].astype(np.int64)
        n = len(c["surface"])
        lens = np.diff(off)
        row = np.repeat(np.arange(n), lens)
        recency = off[1:][row] - 1 - np.arange(len(row))
        match = c["hist__category"] == c["ad_category"][row]
        eng = match & np.isin(c["hist__action"], ENGAGE_ACTIONS)
        hand = np.stack(
            [
                np.bincount(row[match & (recency < cfg.recent_k)], minlength=n)
                / np.maximum(np.minimum(lens, cfg.recent_k), 1),
                np.log1p(np.bincount(row[eng], minlength=n)),
                c["ad_quality"].astype(np.float64),
            ],
            1,
        )
        parts = {
            "day": np.full(n, ch.day),
            "surface": c["surface"].astype(np.int64),
            "y": ch.click.astype(np.float64),
            "p": ch.p_click,
            "hand": hand,
            **{f"t_{k}": v for k, v in ch.click_terms.items()},
        }
        for k, v in parts.items():
            cols.setdefault(k, []).append(v)
    return {k: np.concatenate(v) for k, v in cols.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/small.toml")
    p.add_argument("overrides", nargs="*", help="data.sim.KEY=VALUE overrides")
    args = p.parse_args(argv)
    run_cfg = load_run_config(args.config, args.overrides)
    cfg = SimConfig.from_dict(dict(run_cfg.data.sim))
    d = collect(cfg)
    last = cfg.days - 1
    tr, te = d["day"] < last, d["day"] == last
    y, s, S = d["y"], d["surface"], cfg.surfaces
    names = [k[2:] for k in d if k.startswith("t_")]
    T = {k: d[f"t_{k}"] for k in names}
    print(
        f"simulator {args.config} {' '.join(args.overrides)}: {len(y)} rows, click rate {y.mean():.4f}, "
        f"eval = day {last} ({te.sum()} rows)"
    )
    print(f"{'term':<14}{'std':>8}")
    for k in names:
        print(f"{k:<14}{T[k].std():>8.3f}")

    def terms_ne(keys: list[str]) -> float:
        x = np.stack([T[k] for k in keys], 1) if keys else np.zeros((len(y), 1))
        return ne(fit_logistic(x[tr], s[tr], y[tr], x[te], s[te], S), y[te])

    print(f"\nNE on day {last} (click, all surfaces pooled; lower is better)")
    print(f"{'what the predictor knows':<58}{'NE':>8}")
    print(f"{'oracle (true probability)':<58}{ne(d['p'][te], y[te]):>8.4f}")
    print(f"{'all true terms (refitted)':<58}{terms_ne(names):>8.4f}")
    learnable = [k for k in names if k not in GROUPS["per-id (id_latent, user_bias, ad_bias)"]]
    print(f"{'all but per-id terms  <- ceiling at this row count':<58}{terms_ne(learnable):>8.4f}")
    for g, keys in GROUPS.items():
        print(f"{'only ' + g:<58}{terms_ne(keys):>8.4f}")
    hand = d["hand"]
    print(
        f"{'hand features (recent match, engaged, quality) [visible]':<58}"
        f"{ne(fit_logistic(hand[tr], s[tr], y[tr], hand[te], s[te], S), y[te]):>8.4f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
