"""How much of the oracle gap a model trained on the past days can reach at all (issue 14's gap target).

    .venv/bin/python benchmarks/sim_reachable.py DATA [--ref NAME=NE ...] [--train-days 0-5] [--rows N]
        [--task click|conversion]

``benchmarks/missed_signals.py`` scores a model against "all learnable true terms": a logistic regression on
the simulator's true click terms *of the test day*, fitted on that day's first half. Two of those terms move
with time: ``cross2`` and ``id_latent`` weigh their latent products by per-surface weights that rotate by
``drift_rad_per_day`` (the simulator's concept drift), so on the test day they carry weights that no row of an
earlier day shows. A model trained on days 0-5 and scored on day 6 can at best learn the products and the
weights the training days imply. This tool measures that bound: the same per-surface logistic regression on
stationary features (the 8 latent products of ``cross2`` and of ``id_latent`` as separate columns, every
other term as the simulator computes it, the daily cycle as sin / cos of the hour), fitted on the training
days and scored on the second half of the test day (the rows ``missed_signals.py`` scores). It is generous:
it knows every latent product exactly, which a model must learn from ids and attributes, so its NE is a
floor for any model trained on those days, not an estimate of one.

``--task conversion`` bounds the conversion task the same way. The simulator's conversion probability is the
click probability times a conversion-given-click probability whose logit has no drifting term (objective, the
age bucket, the format bias, the recent and affinity history terms, a user-attribute x ad-attribute product
and, per id, a user x ad latent product and the ad's bias). So the bound is the click bound's probability
times a per-surface logistic regression on those terms, exactly as the simulator computes them (each product's
8 coordinates as separate columns), fitted on the clicked rows of the same training rows; NE on the rows whose
conversion label is observed, as every evaluation in the house scores conversion.

``--ref NAME=NE`` adds a model's NE on the same rows (e.g. ``missed_signals.py``'s "model logit" lines) and
prints the share of the DLRM -> oracle gap it closes beside the share the bound allows (give ``dlrm=NE``).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_learnability import fit_logistic, ne  # noqa: E402

STATIONARY = ("recent", "engaged", "affinity", "cross3", "cat_cross", "fmt_bias", "quality", "activity",
              "topic_drift")
PER_ID_STATIONARY = ("user_bias", "ad_bias")
# the conversion-given-click logit's terms (none drifts), without their weights: the fit learns those
CVR_TERMS = ("c_objective", "c_recent", "c_affinity", "c_age", "c_fmt_bias")
CVR_PER_ID = ("c_ad_bias",)


def day_range(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def regenerate(data: Path, days: set[int]) -> dict[str, np.ndarray]:
    """Every row of ``days`` with its click terms and the latent products behind the rotating ones."""
    from opengem.data import sim_core
    from opengem.data.sim_config import SimConfig

    cfg = SimConfig.from_dict(json.loads((data / "summary.json").read_text())["config"])
    world = sim_core.World(cfg)
    K = cfg.latent_dim
    seen: list[dict[str, np.ndarray]] = []
    original = sim_core.click_terms

    def recording(world_: sim_core.World, **kw: np.ndarray) -> dict[str, np.ndarray]:
        H = world_.H
        ua = world_.user_attr_vec(kw["age"], kw["country"], kw["device"])
        aa = world_.ad_attr_vec(kw["ad_topic"], kw["fmt"], kw["objective"])
        seen.append({
            "tday": kw["tday"],
            "attr_prod": ua * aa,
            "id_prod": H.latent(sim_core.T_USER_LAT, kw["user"], K)
            * H.latent(sim_core.T_AD_LAT, kw["ad"], K),
            # the conversion-given-click logit's inputs (sim_core.generate_chunk's cvr_logit)
            "cvr_attr_prod": ua[:, ::-1] * aa,
            "cvr_id_prod": H.latent(sim_core.T_USER_LAT2, kw["user"], K)
            * H.latent(sim_core.T_AD_LAT2, kw["ad"], K),
            "c_objective": world_.obj_cvr[kw["objective"]],
            "c_recent": kw["recent_frac"],
            "c_affinity": kw["affinity"],
            "c_age": (kw["age"] - cfg.age_buckets / 2) / max(cfg.age_buckets, 1),
            "c_fmt_bias": H.normal(sim_core.T_FMTB, kw["s"] * cfg.formats + kw["fmt"]),
            "c_ad_bias": H.normal(sim_core.T_ABIAS, kw["ad"]),
        })
        return original(world_, **kw)

    cols: dict[str, list[np.ndarray]] = {}
    sim_core.click_terms = recording
    try:
        for i, (d, r0, r1) in enumerate(sim_core.chunk_plan(cfg)):
            if d not in days:
                continue
            seen.clear()
            ch = sim_core.generate_chunk(world, d, r0, r1, i)
            assert len(seen) == 1, "click_terms ran more than once for one chunk"
            hour = 2 * np.pi * ch.columns["hour_of_day"].astype(np.float64)
            parts = {"y": ch.click.astype(np.float64), "p": ch.p_click, "surface": ch.columns["surface"],
                     "conv": ch.conversion.astype(np.float64), "conv_observed": ch.conv_observed,
                     "p_conv": ch.p_conversion,
                     "day": np.full(r1 - r0, d), "hour_sin": np.sin(hour), "hour_cos": np.cos(hour),
                     **seen[0], **{f"t_{k}": v for k, v in ch.click_terms.items()}}
            for k, v in parts.items():
                cols.setdefault(k, []).append(np.asarray(v))
    finally:
        sim_core.click_terms = original
    return {k: np.concatenate(v) for k, v in cols.items()}


def features(t: dict[str, np.ndarray], rows: np.ndarray, *, per_id: bool, rotating: bool) -> np.ndarray:
    """Stationary columns (``rotating=False``) or the true terms of the row's own day (``rotating=True``)."""
    cols = [t[f"t_{k}"][rows] for k in STATIONARY] + [t["hour_sin"][rows], t["hour_cos"][rows]]
    cols += [t["t_cross2"][rows]] if rotating else list(t["attr_prod"][rows].T)
    if per_id:
        cols += [t[f"t_{k}"][rows] for k in PER_ID_STATIONARY]
        cols += [t["t_id_latent"][rows]] if rotating else list(t["id_prod"][rows].T)
    return np.stack(cols, 1)


def cvr_features(t: dict[str, np.ndarray], rows: np.ndarray, *, per_id: bool) -> np.ndarray:
    """The conversion-given-click logit's inputs: nothing in it drifts, so these are stationary."""
    cols = [t[k][rows] for k in CVR_TERMS] + list(t["cvr_attr_prod"][rows].T)
    if per_id:
        cols += [t[k][rows] for k in CVR_PER_ID] + list(t["cvr_id_prod"][rows].T)
    return np.stack(cols, 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", type=Path, help="a simulated dataset folder (its summary.json has the simulator)")
    p.add_argument("--train-days", default="0-5", help="days the bound is fitted on, e.g. 0-5 or 3-5")
    p.add_argument("--test-day", type=int, default=None, help="default: the stream's last day")
    p.add_argument("--rows", type=int, default=400_000, help="training rows sampled for the fit")
    p.add_argument("--score", choices=("second-half", "whole"), default="second-half",
                   help="test-day rows scored: missed_signals.py's second half, or the whole day (the "
                        "iso-FLOP study's frontier test); with 'whole' the first-half fit is not shown")
    p.add_argument("--task", choices=("click", "conversion"), default="click")
    p.add_argument("--ref", action="append", default=[],
                   help="NAME=NE on the same rows (dlrm=... for shares)")
    args = p.parse_args(argv)
    summary = json.loads((args.data / "summary.json").read_text())
    test_day = args.test_day if args.test_day is not None else int(summary["config"]["days"]) - 1
    train_days = day_range(args.train_days)
    t = regenerate(args.data, {*train_days, test_day})
    on_test = np.flatnonzero(t["day"] == test_day)
    first = on_test[: len(on_test) // 2]
    second = on_test if args.score == "whole" else on_test[len(on_test) // 2:]
    conversion = args.task == "conversion"
    if conversion:  # scored where the label is observed, as every evaluation scores conversion
        second = second[t["conv_observed"][second]]
    pool = np.flatnonzero(np.isin(t["day"], train_days))
    rng = np.random.default_rng(0)
    fit_rows = np.sort(rng.choice(pool, size=min(args.rows, len(pool)), replace=False))
    s, y = t["surface"], t["y"]
    n_surf = int(s.max()) + 1
    label = t["conv"] if conversion else y

    fits = {"first": first, "train": fit_rows}

    @functools.cache
    def p_cvr(which: str, per_id: bool) -> np.ndarray:
        """P(conversion | click) on the scored rows, fitted on the clicked rows of ``fits[which]`` with an
        observed label: one fit per training rows and feature set, shared by every click predictor on them."""
        tr = fits[which]
        clicked = tr[(y[tr] == 1) & t["conv_observed"][tr]]
        return fit_logistic(cvr_features(t, clicked, per_id=per_id), s[clicked], t["conv"][clicked],
                            cvr_features(t, second, per_id=per_id), s[second], n_surf)

    def score(which: str, **kw: bool) -> float:
        tr = fits[which]
        x_tr, x_te = features(t, tr, **kw), features(t, second, **kw)
        p = fit_logistic(x_tr, s[tr], y[tr], x_te, s[second], n_surf)
        if conversion:
            p = p * p_cvr(which, kw["per_id"])
        return ne(p, label[second])

    oracle = ne((t["p_conv"] if conversion else t["p"])[second], label[second])
    rows = [("oracle (true probability)", oracle)]
    for per_id in (False, True):
        tag = "with per-id terms" if per_id else "no per-id terms"
        if args.score != "whole":
            rows.append((f"true terms of the test day, fitted on its first half ({tag})",
                         score("first", per_id=per_id, rotating=True)))
        rows += [
            (f"true terms of each row's day, fitted on days {args.train_days} ({tag})",
             score("train", per_id=per_id, rotating=True)),
            (f"stationary features, fitted on days {args.train_days} ({tag}): the bound",
             score("train", per_id=per_id, rotating=False)),
        ]
    refs = {k: float(v) for k, v in (r.split("=", 1) for r in args.ref)}
    rows += [(f"{k} (given)", v) for k, v in refs.items()]
    where = "all of" if args.score == "whole" else "the second half of"
    print(f"{args.data}: {args.task} NE on {where} day {test_day} ({len(second):,} rows"
          + (" with an observed label" if conversion else "") + "); "
          f"fits on {len(fit_rows):,} rows of days {args.train_days}")
    dlrm = refs.get("dlrm")
    print(f"  {'predictor':<88}{'NE':>8}" + (f"{'DLRM->oracle gap closed':>26}" if dlrm else ""))
    for label, v in rows:
        share = f"{(dlrm - v) / (dlrm - oracle):>25.1%}" if dlrm else ""
        print(f"  {label:<88}{v:>8.4f}" + share)
    return 0


if __name__ == "__main__":
    sys.exit(main())
