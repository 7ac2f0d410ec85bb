"""What the experiment chooses on the validation windows before any arm runs for the record: KD's point
and every arm's epochs per window, one choice for all VM surfaces or one per surface.

Why per arm: calibration round 5 measured that the best training length differs by arm (the labels-only
baseline memorises its 1-2-day window past one epoch; KD's soft labels regularise, so KD gains from 2-4),
so one length for every arm handicaps whichever arm it was not tuned for. Why per surface: a VM serves one
surface, and a KD point tuned on the mean over surfaces is set by the surface with the larger gain (round 5:
stories set the point and feed's KD VM ended below its baseline).

Why pooled over seeds (``tune_seeds``): calibration round 6 measured that one seed's ~4.6-6.8k validation
rows per surface cannot tell 36 KD candidates apart (the five best within 0.004 NE) and that the point one
seed chose gave TR 0.47 on that seed and 0.10 / -0.04 on the others. With ``tune_seeds = N`` a candidate's
score is the mean over the first N seeds of each seed's validation NE -- the pooling the calibration
table's pooled TR uses (``results.summarize_key``), so the choice optimises the number the band is
checked on; N = 1 is the original rule.

Equal budget: every arm's epochs are chosen over the same set (``tune_epochs``; the baseline too); KD's
over that set x ``kd.grid``, and every distilling arm reuses its surface's KD point, so no arm gets more
tuning than KD. Every choice reads the tuning seeds' validation rows only (``select_rows`` with each
seed's own validation example ids, applied before anything is scored): the evaluation windows choose
nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from opengem.errors import TrainError
from opengem.transfer.aggregate import select_rows
from opengem.transfer.arms import arm_configs, ne_by_surface
from opengem.transfer.experiment_config import ExperimentConfig
from opengem.transfer.vm_train import ArmConfig

if TYPE_CHECKING:
    from opengem.transfer.seed_run import SeedRun


@dataclass
class Tuned:
    """The choices, per VM surface (a shared choice repeats the same value on every surface)."""

    kd_point: dict[str, list[float]]  # surface -> [weight, temperature(, mse)]
    epochs: dict[str, dict[str, int]]  # arm -> surface -> epochs per window
    kd_scores: list[dict[str, Any]]  # every (epochs, KD point): validation NE, mean and per surface
    epoch_scores: dict[str, list[dict[str, Any]]]  # arm -> every candidate length's validation NE

    def arm_cfgs(self, cfg: ExperimentConfig) -> dict[str, dict[str, ArmConfig]]:
        """Every arm's config per surface: that surface's KD point and epochs."""
        return {s: arm_configs(cfg, p, {a: e[s] for a, e in self.epochs.items()})
                for s, p in self.kd_point.items()}

    def record(self) -> dict[str, Any]:
        """``transfer.json -> kd_tuned``: the shared point's weight/temperature/epochs (None when surfaces
        differ), each surface's, and every candidate's validation NE."""
        if not self.kd_scores:  # no arm distils: no KD point was tuned
            return {"weight": None, "temperature": None, "epochs": None, "surfaces": {}, "grid_ne": []}
        per = {s: {"weight": p[0], "temperature": p[1], "epochs": self.epochs["kd"][s], "point": p}
               for s, p in self.kd_point.items()}
        first = next(iter(per.values()))
        same = all(v == first for v in per.values())
        shared = {k: first[k] if same else None for k in ("weight", "temperature", "epochs")}
        return {**shared, "surfaces": per, "grid_ne": self.kd_scores}


def scores(seed_res: dict[str, Any], pick: Any) -> dict[str, Any]:
    """Validation NE of one candidate: ``ne`` over every surface x task (the shared choice's score) and
    ``ne_per_surface`` over each surface's tasks (the per-surface choice's)."""
    by = ne_by_surface(seed_res, pick)
    flat = [ne for v in by.values() for ne in v]
    return {"ne": float(np.mean(flat)) if flat else float("nan"),
            "ne_per_surface": {s: float(np.mean(v)) if v else float("nan") for s, v in by.items()}}


def kd_grid_ne(seed_res: dict[str, Any], grid: list[list[float]]) -> list[dict[str, Any]]:
    """Every KD grid point's validation NE (:func:`scores`, on the rows given), in grid order, kept in
    transfer.json so that a reader sees whether the tuned point sits at the grid's edge (then the grid,
    shared by every arm, is too narrow)."""
    return [{"point": list(g), **scores(seed_res, lambda r, g=g: r["kd_grid"][tuple(g)])} for g in grid]


def pooled(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """One candidate's score over the tuning seeds (each a :func:`scores` dict): the mean over seeds of
    ``ne`` and of each surface's ``ne_per_surface`` (a seed whose rows cannot score it is left out of the
    mean; NaN when none can). Several seeds also keep each seed's own scores (``seeds``), so a reader sees
    whether the seeds agree."""
    def mean(vals: list[float]) -> float:
        ok = [v for v in vals if np.isfinite(v)]
        return float(np.mean(ok)) if ok else float("nan")

    surfaces = list(per_seed[0]["ne_per_surface"])
    out = {"ne": mean([p["ne"] for p in per_seed]),
           "ne_per_surface": {s: mean([p["ne_per_surface"][s] for p in per_seed]) for s in surfaces}}
    if len(per_seed) > 1:
        out["seeds"] = [{"ne": p["ne"], "ne_per_surface": p["ne_per_surface"]} for p in per_seed]
    return out


def choose(cands: list[dict[str, Any]], surfaces: list[str], per_surface: bool, what: str) -> dict[str, Any]:
    """Per surface, the candidate with the lowest validation NE (its own surface's when ``per_surface``,
    else the mean over surfaces, one winner for all); ties go to fewer epochs, then to the earlier
    candidate (grid order)."""
    def best(score: Any) -> dict[str, Any]:
        ok = [(score(c), c["epochs"], i) for i, c in enumerate(cands) if np.isfinite(score(c))]
        if not ok:
            raise TrainError(f"{what}: no candidate has validation rows with both labels to score it on "
                             "(more rows per validation window, or more validation_windows)")
        return cands[min(ok)[2]]

    if not per_surface:
        shared = best(lambda c: c["ne"])
        return {s: shared for s in surfaces}
    return {s: best(lambda c, s=s: c["ne_per_surface"].get(s, float("nan"))) for s in surfaces}


def tune_on_validation(runs: list[SeedRun], val_ids: list[np.ndarray], arms: list[str],
                       log: Any = print) -> Tuned:
    """KD's point (over ``tune_epochs`` x ``kd.grid``, or the grid at KD's configured length) and, with
    ``tune_epochs``, every other arm's length, on the validation rows of the first ``tune_seeds`` runs
    (``val_ids[i]``: run i's validation example ids), pooled by :func:`pooled`; all of a run's rows when
    the config has no validation windows (the original protocol, refused with the tuning options)."""
    cfg = runs[0].cfg
    n = cfg.tune_seeds
    if len(runs) < n or len(val_ids) < n:
        raise TrainError(f"tune_seeds = {n}: only {min(len(runs), len(val_ids))} seed(s) to tune on")
    tuning = list(zip(runs[:n], val_ids[:n]))
    surfaces = runs[0].surfaces

    def rows(res: dict[str, Any], ids: np.ndarray) -> dict[str, Any]:
        return select_rows(res, ids) if cfg.validation_windows else res

    kd_scores = []
    distils = any(a != "baseline" for a in arms)
    if distils:
        for e in cfg.tune_epochs or [cfg.epochs_for("kd")]:
            per_seed = [kd_grid_ne(rows(r.run_lag(cfg.lag, [], None, kd_grid_epochs=e), ids), cfg.kd.grid)
                        for r, ids in tuning]
            kd_scores += [{"epochs": e, "point": list(g), **pooled([ps[i] for ps in per_seed])}
                          for i, g in enumerate(cfg.kd.grid)]
        kd = choose(kd_scores, surfaces, cfg.tune_per_surface, "kd.grid")
        points = {s: c["point"] for s, c in kd.items()}
        epochs = {"kd": {s: c["epochs"] for s, c in kd.items()}}
    else:  # labels only (e.g. the bigger baselines of a Pareto plot): no arm reads a KD point, train no grid
        points = {s: list(cfg.kd.grid[0]) for s in surfaces}
        epochs = {"kd": {s: cfg.epochs_for("kd") for s in surfaces}}
    others = [a for a in arms if a != "kd"]
    epoch_scores: dict[str, list[dict[str, Any]]] = {}
    if cfg.tune_epochs:
        epoch_scores = {a: [] for a in others}
        for e in cfg.tune_epochs:
            acfgs = {s: arm_configs(cfg, points[s], {a: e for a in others}) for s in surfaces}
            res = [rows(r.run_lag(cfg.lag, others, None, kd_results={}, surface_arm_cfgs=acfgs), ids)
                   for r, ids in tuning]
            for a in others:
                epoch_scores[a].append({"epochs": e, **pooled([scores(x, lambda r, a=a: r[a]) for x in res])})
        for a in others:
            pick = choose(epoch_scores[a], surfaces, cfg.tune_per_surface, f"tune_epochs ({a})")
            epochs[a] = {s: c["epochs"] for s, c in pick.items()}
    else:
        epochs.update({a: {s: cfg.epochs_for(a) for s in surfaces} for a in others})
    on = f"seed {cfg.seeds[0]}" if n == 1 else f"seeds {', '.join(str(x) for x in cfg.seeds[:n])} pooled"
    for s in surfaces:
        kd_text = f"KD weight={points[s][0]} temperature={points[s][1]}" if distils else "no arm distils"
        log(f"tuned on {s} ({on}): {kd_text}; epochs per window "
            + ", ".join(f"{a} {epochs[a][s]}" for a in epochs if distils or a != "kd"))
    return Tuned(points, epochs, kd_scores, epoch_scores)
