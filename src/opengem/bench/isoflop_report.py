"""The iso-FLOP study's runs -> frontier with CIs, fitted laws, compute-efficiency ratios, calibration.

Frontier: per family and budget, the size validation chose, scored on the test day over every seed run at
it (mean and 95 % t interval). The law ``NE = a * C^-b + c`` is fitted per family on its frontier means
(c searched between the oracle NE and the lowest NE: no family can beat the oracle). Efficiency ratio of a
baseline at a budget: the budget its fitted law needs to reach the reference's measured frontier NE there,
over that budget; its interval resamples the seeds of both families (bootstrap) and refits. Calibration
(mean prediction / observed rate) is reported pooled per task and per surface x task for every frontier
point, averaged over its seeds, with the issue's bounds ([0.95, 1.05] pooled, [0.85, 1.15] per cell).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from opengem.bench.fit import PowerLaw, fit_power_law, mean_ci, percentile_interval, t975
from opengem.bench.size_ladder import metric_keys, selection_ne

POOLED_BOUNDS = (0.95, 1.05)
CELL_BOUNDS = (0.85, 1.15)
OPTIMAL_KEYS = ("budget", "flops_budget", "size", "fwd_flops", "examples", "dense_params")


def calibration_summary(metrics_per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Calibration per key averaged over seeds; ``pooled`` = the ``all/<task>`` keys, ``cells`` the rest,
    and whether each lies within its bound."""
    keys = sorted({k for m in metrics_per_seed for k in m})
    mean = {}
    for k in keys:
        vals = [m[k]["calibration"] for m in metrics_per_seed
                if k in m and m[k].get("calibration") is not None]
        if vals:
            mean[k] = float(np.mean(vals))
    pooled = {k: v for k, v in mean.items() if k.startswith("all/")}
    cells = {k: v for k, v in mean.items() if not k.startswith("all/")}
    cell_vals = list(cells.values())
    return {"pooled": pooled, "cells": cells,
            "cell_range": [min(cell_vals), max(cell_vals)] if cell_vals else None,
            "pooled_ok": all(POOLED_BOUNDS[0] <= v <= POOLED_BOUNDS[1] for v in pooled.values()),
            "cells_ok": all(CELL_BOUNDS[0] <= v <= CELL_BOUNDS[1] for v in cell_vals)}


def fit_frontier(cs: list[float], nes: list[float], floor: float | None, grid: int = 400) -> PowerLaw | None:
    """The law on a frontier: c free in [floor, min NE); None when it cannot be fitted (too few points)."""
    try:
        return fit_power_law(cs, nes, c_min=floor, grid=grid)
    except ValueError:
        return None


def efficiency_ratio(base: PowerLaw | None, target_ne: float, c: float) -> float:
    """The compute ``base`` needs to reach ``target_ne``, over ``c``; inf = never (its asymptote is above),
    NaN = its law does not fall with compute."""
    if base is None or not base.decreasing:
        return float("nan")
    return base.inverse(target_ne) / c


def lr_rule(cfg: Any) -> str:
    """How the study chose each family's learning rate, in words (the report's "learning rate:" line)."""
    each = cfg.lr_budgets == "each"
    seeds = "seed 0" if cfg.lr_seeds == 1 else f"seeds 0-{cfg.lr_seeds - 1}"
    if not cfg.lr_grid:
        rule = "each family's recipe rate (lr_grid = [], nothing searched)"
    elif cfg.lr_sizes == "each":
        rule = (f"grid {cfg.lr_grid} at {'every' if each else 'the smallest'} budget on every ladder rung, "
                f"{seeds}, lowest mean validation NE; each size trains at its own rate"
                + ("" if each else " at every budget"))
    elif each:
        rule = (f"grid {cfg.lr_grid} at every budget on ladder rung {cfg.lr_size}, {seeds}, lowest mean "
                "validation NE; each budget's rate at every size of the family there")
    else:
        rule = (f"grid {cfg.lr_grid} at the smallest budget on ladder rung {cfg.lr_size}, {seeds}, "
                "lowest mean validation NE; reused at every budget and size of the family")
    if cfg.lr_extend and cfg.lr_grid:
        rule += f"; while the best is the grid's edge, up to {cfg.lr_extend} rates beyond it, one at a time"
    return rule


def summarize_study(cfg: Any, st: Any, records: list[dict[str, Any]], lr_choice: dict[str, list[Any]],
                    lr_grid: dict[str, list[dict[str, float]]], lr_check: dict[str, dict[str, float]],
                    best: dict[str, list[int]], plan: list[Any],
                    size_choice: dict[str, list[dict[str, float]]] | None = None,
                    rescored: dict[str, dict[str, Any]] | None = None, *,
                    lr_sizes: dict[str, list[list[Any]]]) -> dict[str, Any]:
    """The frontier, laws, efficiency ratios and differences from the runs; a frontier run named in
    ``rescored`` (``frontier_test_rows``) is scored by those test metrics instead of its own. ``lr_sizes``:
    per family, per budget, per size the rate that size trained at."""
    from opengem.bench.size_ladder import oracle_with_totals
    from opengem.data.dataset import Dataset

    keys = sorted(next(r["test"] for r in records if r["test"]))
    mk = metric_keys(cfg.metric, keys)
    oracle_keys: dict[str, float] = {}
    if Dataset(st.data).truth_files(st.test_spec):
        oracle_keys = {k: v for k, v in oracle_with_totals(st.data, st.test_spec).items() if v == v}
    floor = None
    if oracle_keys and all(k in oracle_keys for k in mk):
        floor = float(np.mean([oracle_keys[k] for k in mk]))

    rescored = rescored or {}

    def test_of(r: dict[str, Any]) -> dict[str, Any]:
        return rescored[r["name"]]["metrics"] if r["name"] in rescored else r["test"]

    frontier: dict[str, list[dict[str, Any]]] = {}
    seeds_ne: dict[str, list[list[float]]] = {}
    curves: dict[str, list[list[dict[str, Any]]]] = {}
    for fam in best:
        frontier[fam], seeds_ne[fam], curves[fam] = [], [], []
        for b, size in enumerate(best[fam]):
            at = [r for r in records if r["family"] == fam and r["budget"] == b and r["size"] == size
                  and r["lr"] == lr_choice[fam][b]]
            at.sort(key=lambda r: r["seed"])
            nes = [selection_ne(test_of(r), cfg.metric) for r in at]
            mean, half = mean_ci(nes)
            first = at[0]
            per_key = {}
            for k in keys:
                vals = [test_of(r)[k]["ne"] for r in at if test_of(r).get(k, {}).get("ne") is not None]
                if len(vals) == len(at):
                    per_key[k] = float(np.mean(vals))
            frontier[fam].append({
                "budget": b, "flops_budget": first["flops_budget"], "train_flops": first["train_flops"],
                "size": size, "overrides": first["overrides"], "fwd_flops": first["fwd_flops"],
                "examples": first["examples"], "dense_params": first["dense_params"], "lr": lr_choice[fam][b],
                "seeds": len(at), "ne": mean, "ne_ci95": half, "ne_seeds": nes, "valid_ne": first["valid_ne"],
                "ne_per_key": per_key, "calibration": calibration_summary([test_of(r) for r in at]),
                "test_rows": (rescored[first["name"]]["rows_scored"] if first["name"] in rescored
                              else "eval_rows"),
                "calibration_fit_rows": rescored.get(first["name"], {}).get("calibration_fit_rows"),
                "ne_own_test": [r["test_ne"] for r in at] if rescored else None})
            seeds_ne[fam].append(nes)
            pts = sorted((r for r in records if r["family"] == fam and r["budget"] == b and r["seed"] == 0
                          and r["lr"] == lr_sizes[fam][b][r["size"]]), key=lambda r: r["size"])
            curves[fam].append([{"size": r["size"], "fwd_flops": r["fwd_flops"], "examples": r["examples"],
                                 "valid_ne": r["valid_ne"], "test_ne": r["test_ne"]} for r in pts])

    fits: dict[str, PowerLaw | None] = {
        fam: fit_frontier([p["train_flops"] for p in fr], [p["ne"] for p in fr], floor)
        for fam, fr in frontier.items()}
    ref = cfg.reference
    efficiency = (efficiency_table(frontier, seeds_ne, fits, floor, ref, cfg.bootstrap) if ref in frontier
                  else {})
    gap = _gap_closed(frontier, oracle_keys, keys)
    differences = {fam: [welch_difference(p_ref["ne_seeds"], p["ne_seeds"])
                         for p_ref, p in zip(frontier[ref], fr)]
                   for fam, fr in frontier.items() if fam != ref} if ref in frontier else {}
    lr_transfer = {fam: (min(chk, key=lambda k: chk[k] if chk[k] == chk[k] else math.inf)
                         == format(lr_choice[fam][-1], "g")) for fam, chk in lr_check.items()}
    rule = lr_rule(cfg)
    each = cfg.lr_budgets == "each"
    at_rate = "each size's own rate" if cfg.lr_sizes == "each" else "each budget's rate"
    size_rule = (f"lowest seed-0 validation NE at {at_rate}" if cfg.size_seeds == 1 else
                 f"the {cfg.size_finalists} sizes with the lowest seed-0 validation NE at {at_rate}, "
                 f"then the lowest mean validation NE over seeds 0-{cfg.size_seeds - 1}")
    return {
        "metric": cfg.metric, "metric_keys": mk,
        # per family, per budget: {size: its mean validation NE over the seeds that chose it}
        "size": {"rule": size_rule, "scores": size_choice or {}},
        "oracle_ne": floor, "oracle_per_key": oracle_keys,
        "calibrate": cfg.calibrate,  # none, or how each run's test was calibrated on its validation rows
        # the rows every run is scored on: eval_rows of validation and of test (0 = all), their first rows or
        # (eval_sample = spread) whole row groups spread over the day
        "eval": {"rows": cfg.eval_rows, "sample": cfg.eval_sample},
        "budgets": list(cfg.budgets), "splits": {"train": st.train_spec, "valid": st.valid_spec,
                                                 "test": st.test_spec}, "train_rows": st.train_rows,
        "law": "NE = a * C^-b + c on the frontier, C = training FLOPs = 3 x forward FLOPs/example x rows",
        # "chosen" and "grid": one rate and one grid per family (the smallest budget's) unless lr_budgets =
        # "each", then a list per family, one per budget
        "lr": {"rule": rule,
               "chosen": {f: (list(v) if each else v[0]) for f, v in lr_choice.items()},
               "grid": {f: (list(g) if each else g[0]) for f, g in lr_grid.items()},
               "check_largest_budget": lr_check,
               # per family, per budget: the rate each size trained at (one rate per budget unless lr_sizes =
               # "each")
               "per_size": lr_sizes,
               "chosen_still_best_at_largest": lr_transfer},
        "frontier": frontier, "fits": {k: (v.to_dict() if v else None) for k, v in fits.items()},
        "efficiency_reference": ref, "efficiency": efficiency, "gap_closed_vs_dlrm": gap,
        "difference_vs_reference": differences,
        "compute_optimal": {f: [{k: p[k] for k in OPTIMAL_KEYS} for p in fr] for f, fr in frontier.items()},
        "isoflop_curves": curves, "runs": len(records),
        "plan": [{k: getattr(p, k) for k in ("family", "size", "budget", "fwd_flops", "steps", "examples")}
                 for p in plan],
    }


def efficiency_table(frontier: dict[str, list[dict[str, Any]]], seeds_ne: dict[str, list[list[float]]],
                     fits: dict[str, PowerLaw | None], floor: float | None, ref: str, n_boot: int,
                     seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """Per baseline family, per budget of ``ref``'s frontier: the compute the family's law needs to reach
    ``ref``'s NE there, over ``ref``'s compute, with a 95 % bootstrap interval (seeds of every family
    resampled, each resample's law refitted). ``frontier[fam]``: points with ``train_flops`` and ``ne``;
    ``seeds_ne[fam]``: each point's seeds' NE. Shared by the study's report and the scripts that extend its
    frontier with runs of their own."""
    boot = _bootstrap_means(seeds_ne, n_boot, np.random.default_rng(seed))
    efficiency: dict[str, list[dict[str, Any]]] = {}
    for fam in frontier:
        if fam == ref:
            continue
        fr, lo_c, hi_c = frontier[fam], frontier[fam][0]["train_flops"], frontier[fam][-1]["train_flops"]
        boot_fits = [fit_frontier([p["train_flops"] for p in fr], list(bm[fam]), floor, grid=100)
                     for bm in boot]
        rows: list[dict[str, Any]] = []
        for b, p_ref in enumerate(frontier[ref]):
            ratio = efficiency_ratio(fits[fam], p_ref["ne"], p_ref["train_flops"])
            samples = [efficiency_ratio(f, float(bm[ref][b]), p_ref["train_flops"])
                       for f, bm in zip(boot_fits, boot)]
            needed = ratio * p_ref["train_flops"]
            rows.append({"budget": b, "c_ref": p_ref["train_flops"], "ne_ref": p_ref["ne"],
                         "ratio": ratio, "reachable": (not math.isinf(ratio)) if ratio == ratio else None,
                         "ci95": list(percentile_interval(samples)),
                         "unreachable_share": float(np.mean([math.isinf(s) for s in samples])) if samples
                         else None,
                         "extrapolated": bool(math.isfinite(needed) and not lo_c <= needed <= hi_c)
                         if needed == needed else None})
        efficiency[fam] = rows
    return efficiency


def frontier_laws(points: dict[str, list[tuple[float, list[float]]]], floor: float | None, ref: str,
                  n_boot: int) -> tuple[dict[str, PowerLaw | None], dict[str, list[dict[str, Any]]]]:
    """Each family's law on its frontier ``points`` (training FLOPs, the seeds' NE) and
    :func:`efficiency_table` against ``ref``: what the study reports, for a frontier assembled outside one
    study's runs."""
    fits = {f: fit_frontier([c for c, _ in p], [float(np.mean(n)) for _, n in p], floor)
            for f, p in points.items()}
    frontier = {f: [{"train_flops": c, "ne": float(np.mean(n))} for c, n in p] for f, p in points.items()}
    seeds_ne = {f: [n for _, n in p] for f, p in points.items()}
    return fits, efficiency_table(frontier, seeds_ne, fits, floor, ref, n_boot)


def format_laws(fits: dict[str, PowerLaw | None], table: dict[str, list[dict[str, Any]]], ref: str,
                budget: str) -> str:
    """:func:`frontier_laws`'s result as the follow-up scripts print it: each law, then each baseline's
    compute to reach ``ref``'s NE at its largest budget (named ``budget``), over ``ref``'s."""
    lines = [f"{fam}: law {law.to_dict() if law else None}" for fam, law in fits.items()]
    for fam, rows in table.items():
        lo, hi = rows[-1]["ci95"]
        lines.append(f"{fam} compute to reach {ref}'s {budget} NE, over {ref}'s: {rows[-1]['ratio']:.2f}x "
                     f"[{lo:.2f}, {hi:.2f}]")
    return "\n".join(lines)


def welch_difference(a: list[float], b: list[float]) -> dict[str, Any]:
    """mean(a) - mean(b) with its 95 % Welch t interval (unequal variances, Welch-Satterthwaite degrees of
    freedom rounded down). Seed s gives two families the same row order but different sizes read different
    rows, so the seeds are treated as independent runs rather than pairs: the wider, conservative choice."""
    x = np.asarray([v for v in a if v == v], dtype=np.float64)
    y = np.asarray([v for v in b if v == v], dtype=np.float64)
    if x.size == 0 or y.size == 0:
        return {"diff": float("nan"), "ci95": [float("nan"), float("nan")], "excludes_zero": False}
    diff = float(x.mean() - y.mean())
    if x.size < 2 or y.size < 2:
        return {"diff": diff, "ci95": [float("nan"), float("nan")], "excludes_zero": False}
    vx, vy = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    se = math.sqrt(vx + vy)
    if se == 0.0:
        return {"diff": diff, "ci95": [diff, diff], "excludes_zero": diff != 0.0}
    df = (vx + vy) ** 2 / (vx**2 / (x.size - 1) + vy**2 / (y.size - 1))
    half = t975(max(1, int(df))) * se
    lo, hi = diff - half, diff + half
    return {"diff": diff, "ci95": [lo, hi], "excludes_zero": bool(lo > 0 or hi < 0)}


def format_difference(w: dict[str, Any]) -> str:
    """A :func:`welch_difference` as the follow-up scripts print it: ``-0.0081 [-0.0131, -0.0030] *`` (the
    star when the interval excludes 0)."""
    lo, hi = w["ci95"]
    return f"{w['diff']:+.4f} [{lo:+.4f}, {hi:+.4f}]{' *' if w['excludes_zero'] else ''}"


def _bootstrap_means(seeds_ne: dict[str, list[list[float]]], n: int, rng: np.random.Generator
                     ) -> list[dict[str, np.ndarray]]:
    """``n`` resamples: per family and budget, the mean of its seeds drawn with replacement."""
    out = []
    for _ in range(n):
        out.append({fam: np.array([float(np.mean(rng.choice(v, size=len(v)))) for v in per_b])
                    for fam, per_b in seeds_ne.items()})
    return out


def _gap_closed(frontier: dict[str, list[dict[str, Any]]], oracle: dict[str, float], keys: list[str]
                ) -> dict[str, list[dict[str, float]]]:
    """Per family and budget, per pooled task: (NE_dlrm - NE_family) / (NE_dlrm - NE_oracle)."""
    if "dlrm" not in frontier or not oracle:
        return {}
    out: dict[str, list[dict[str, float]]] = {}
    tasks = [k for k in keys if k.startswith("all/") and k in oracle]
    for fam, fr in frontier.items():
        out[fam] = []
        for p, d in zip(fr, frontier["dlrm"]):
            row = {}
            for k in tasks:
                ne, ne_d = p["ne_per_key"].get(k), d["ne_per_key"].get(k)
                if ne is not None and ne_d is not None and ne_d > oracle[k]:
                    row[k] = (ne_d - ne) / (ne_d - oracle[k])
            out[fam].append(row)
    return out


def json_safe(x: Any) -> Any:
    """JSON has no NaN or Infinity: non-finite numbers become None (the table and flags say why)."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def _fmt(x: Any, spec: str = ".4f") -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return format(x, spec)


def _frontier_rows_note(res: dict[str, Any]) -> str:
    rows = sorted({p.get("test_rows") for fr in res["frontier"].values() for p in fr} - {None, "eval_rows"})
    if not rows:
        return ""
    fits = sorted({p.get("calibration_fit_rows") for fr in res["frontier"].values() for p in fr} - {None})
    refit = (", their calibration refitted on " + "/".join(f"{r:,}" for r in fits) + " validation rows"
             if fits else "")
    return ("; frontier runs scored again on " + "/".join(f"{r:,}" for r in rows) + " test rows" + refit +
            " (frontier_test_rows; the rule chose on validation only)")


EFFICIENCY_TARGET = 2.0  # issue 14: the budget a baseline needs to reach the reference's frontier NE, >= 2x
GAP_TARGET = 0.5  # issue 14: share of the DLRM -> oracle NE gap the reference closes at the largest budget


def scorecard(res: dict[str, Any]) -> list[str]:
    """The reference family against the study's targets (issue 14), read off the report's own numbers: where
    its frontier NE is below each family's, whether the largest budget's difference excludes 0, the
    efficiency ratio there, calibration in bounds per family, and the DLRM -> oracle gap it closes."""
    ref = res["efficiency_reference"]
    if ref not in res["frontier"]:
        return []
    budgets, last = res["budgets"], len(res["budgets"]) - 1
    lines = ["", f"scorecard of {ref} (issue 14's targets; from the numbers above):"]
    for fam, rows in (res.get("difference_vs_reference") or {}).items():
        below = [f"{budgets[b]:.2e}" for b, r in enumerate(rows) if r["diff"] < 0]
        r = rows[last]
        verdict = ("below, interval excludes 0" if r["diff"] < 0 and r["excludes_zero"] else
                   "above, interval excludes 0" if r["excludes_zero"] else "interval spans 0")
        lines.append(f"  vs {fam:<7} {ref} below at {len(below)} of {len(rows)} budgets"
                     + (f" ({', '.join(below)})" if below else "") + f"; at the largest: {verdict}")
    for fam, rows in res["efficiency"].items():
        r = rows[last]
        if r["ratio"] != r["ratio"] or not r["reachable"]:
            continue
        lo = r["ci95"][0]
        ok = ("meets" if lo == lo and lo >= EFFICIENCY_TARGET else
              "the point estimate meets, the interval reaches below," if r["ratio"] >= EFFICIENCY_TARGET else
              "below")
        lines.append(f"  efficiency vs {fam:<7} at the largest budget {r['ratio']:.3g}x [95 % "
                     f"{_fmt(r['ci95'][0], '.3g')}, {_fmt(r['ci95'][1], '.3g')}] "
                     f"({ok} the {EFFICIENCY_TARGET:g}x target)")
    for fam, fr in res["frontier"].items():
        pooled = sum(bool(p["calibration"].get("pooled_ok")) for p in fr)
        cells = sum(bool(p["calibration"].get("cells_ok")) for p in fr)
        lines.append(f"  calibration {fam:<7} pooled in [{POOLED_BOUNDS[0]}, {POOLED_BOUNDS[1]}] at {pooled} "
                     f"of {len(fr)} budgets, every cell in [{CELL_BOUNDS[0]}, {CELL_BOUNDS[1]}] at {cells} "
                     f"of {len(fr)}")
    gap = (res.get("gap_closed_vs_dlrm") or {}).get(ref)
    if gap:
        g = gap[last]
        met = "met" if g and min(g.values()) >= GAP_TARGET else "not met"
        lines.append(f"  DLRM -> oracle gap closed by {ref} at the largest budget: "
                     + ", ".join(f"{k} {v:.1%}" for k, v in g.items()) + f" (target {GAP_TARGET:.0%}: {met})")
    return lines


def _eval_rows_line(ev: dict[str, Any] | None) -> list[str]:
    """How many validation and test rows each run was scored on, and which (none: a report written before)."""
    if not ev:
        return []
    if not ev.get("rows"):
        return ["every run scored on the whole validation and test days"]
    how = ("whole row groups spread evenly over each day" if ev.get("sample") == "spread"
           else "each day's first rows")
    return [f"every run scored on {ev['rows']:,} validation and {ev['rows']:,} test rows: {how}"]


def format_study(res: dict[str, Any]) -> str:
    """The printed report: lr choice, frontier (NE +- CI, calibration), laws, efficiency ratios."""
    lines = [f"NE metric: {res['metric']} ({', '.join(res['metric_keys'])}) on the test day "
             f"{res['splits']['test']}; oracle NE {_fmt(res['oracle_ne'])}",
             *_eval_rows_line(res.get("eval")),
             f"learning rate: {res['lr']['rule']}"]
    for fam, grids in res["lr"]["grid"].items():
        grid = grids[0] if isinstance(grids, list) else grids  # lr_budgets = "each": one grid per budget
        chk = res["lr"]["check_largest_budget"].get(fam)
        tail = ""
        if chk:
            ok = res["lr"]["chosen_still_best_at_largest"][fam]
            tail = "; at the largest budget " + ", ".join(f"{k}: {_fmt(v, '.5f')}" for k, v in chk.items())
            tail += " (chosen still best)" if ok else " (chosen NOT best: the rate does not transfer)"
        lines.append(f"  {fam:<7} chose {res['lr']['chosen'][fam]}; validation NE "
                     + ", ".join(f"{k}: {_fmt(v, '.5f')}" for k, v in grid.items()) + tail)
        for b, g in enumerate(grids[1:] if isinstance(grids, list) else [], start=1):
            lines.append(f"  {'':<7} budget {b}: chose {res['lr']['chosen'][fam][b]}; "
                         + ", ".join(f"{k}: {_fmt(v, '.5f')}" for k, v in g.items()))
    if "size" in res:  # studies written before the size rule was recorded lack it
        lines.append(f"size: {res['size']['rule']}")
        for fam, per_budget in res["size"]["scores"].items():
            for b, scores in enumerate(per_budget):
                if len(scores) > 1:
                    lines.append(f"  {fam:<7} budget {b}: " + ", ".join(
                        f"s{k} {_fmt(v, '.5f')}" for k, v in sorted(scores.items(), key=lambda kv: kv[1])))
    tasks = [k for k in res["oracle_per_key"] if k.startswith("all/")] or \
        sorted({k for fr in res["frontier"].values() for p in fr for k in p["calibration"]["pooled"]})
    head = (f"{'family':<7}{'C':>9}{'size':>5}{'MFLOP/ex':>9}{'rows':>9}{'NE':>9}{'+-95%':>8}{'n':>3}"
            + "".join(f"{'cal ' + k.split('/')[1][:5]:>11}" for k in tasks) + f"{'cell cal range':>16}"
            + ("".join(f"{'gap ' + k.split('/')[1][:5]:>11}" for k in tasks) if res["gap_closed_vs_dlrm"]
               else ""))
    calibrated = res.get("calibrate", "none")
    lines += ["", "frontier (best size per budget by validation NE; NE mean over seeds with 95 % t interval; "
              "cal = mean prediction / observed rate; gap = share of the DLRM->oracle NE gap closed"
              + (f"; test scored through each run's {calibrated} calibration fitted on its validation rows"
                 if calibrated != "none" else "") + _frontier_rows_note(res) + ")",
              head, "-" * len(head)]
    for fam, fr in res["frontier"].items():
        for b, p in enumerate(fr):
            cal = p["calibration"]
            rng = cal["cell_range"]
            line = (f"{fam:<7}{p['train_flops']:>9.2e}{p['size']:>5d}{p['fwd_flops'] / 1e6:>9.3f}"
                    f"{p['examples']:>9d}{_fmt(p['ne']):>9}{_fmt(p['ne_ci95']):>8}{p['seeds']:>3d}"
                    + "".join(f"{_fmt(cal['pooled'].get(k), '.3f'):>11}" for k in tasks)
                    + f"{(f'{rng[0]:.2f}-{rng[1]:.2f}' if rng else '-'):>16}")
            if res["gap_closed_vs_dlrm"]:
                g = res["gap_closed_vs_dlrm"][fam][b]
                line += "".join(f"{_fmt(g.get(k), '.1%'):>11}" for k in tasks)
            lines.append(line)
    lines += ["", f"fitted law per family ({res['law']}):"]
    for fam, f in res["fits"].items():
        law = "not fitted (too few frontier points)" if f is None else \
            f"NE = {f['a']:.4g} * C^({-f['b']:.4f}) + {f['c']:.5f} (rmse {f['rmse']:.1e})" \
            + ("" if f["a"] > 0 and f["b"] > 0 else ": does NOT fall with compute")
        lines.append(f"  {fam:<7}{law}")
    ref = res["efficiency_reference"]
    for fam, rows in res["efficiency"].items():
        lines.append(f"compute {fam} needs to reach {ref}'s frontier NE, as a multiple of {ref}'s budget "
                     "(on its fitted law; 95 % bootstrap over seeds):")
        for r in rows:
            head = f"  C={r['c_ref']:.2e} {ref} NE {r['ne_ref']:.5f}: "
            if r["ratio"] != r["ratio"]:
                why = ("no law was fitted to its frontier (too few points)" if res["fits"].get(fam) is None
                       else "its fitted NE does not fall with compute")
                lines.append(head + f"- ({fam}: {why})")
                continue
            tag = " (extrapolated beyond its measured budgets)" if r["extrapolated"] else ""
            what = f"{_fmt(r['ratio'], '.3g')}x" if r["reachable"] else "never (asymptote above this NE)"
            lines.append(head + what
                         + f" [95 % {_fmt(r['ci95'][0], '.3g')}, {_fmt(r['ci95'][1], '.3g')}]{tag}"
                         + (f", never reached in {r['unreachable_share']:.1%} of resamples"
                            if r["unreachable_share"] else ""))
    if res.get("difference_vs_reference"):
        lines += ["", f"{ref} minus each family on the frontier (test NE; < 0 = {ref} better; 95 % Welch t "
                      "interval over the seeds; * = excludes 0):"]
        for fam, rows in res["difference_vs_reference"].items():
            lines.append(f"  {fam:<7}" + "  ".join(
                f"C={res['budgets'][b]:.2e} {_fmt(r['diff'], '+.4f')} [{_fmt(r['ci95'][0], '+.4f')}, "
                f"{_fmt(r['ci95'][1], '+.4f')}]" + ("*" if r["excludes_zero"] else "")
                for b, r in enumerate(rows)))
    lines += scorecard(res)
    lines += ["", "iso-FLOP curves (test NE per size, seed 0; * = compute-optimal by validation):"]
    for fam, per_b in res["isoflop_curves"].items():
        for b, pts in enumerate(per_b):
            best = res["frontier"][fam][b]["size"]
            lines.append(f"  {fam:<7} C={res['budgets'][b]:.2e}: " + ", ".join(
                f"s{q['size']} {q['fwd_flops'] / 1e6:.2f}MF {q['examples']}r {_fmt(q['test_ne'])}"
                + ("*" if q["size"] == best else "") for q in pts))
    return "\n".join(lines)


def write_rows_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """One CSV row per dict; the columns are every key in first-seen order (a key a row lacks is empty)."""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)


def write_study_outputs(out: Path, records: list[dict[str, Any]], result: dict[str, Any]) -> None:
    """OUT/isoflop.json (the summary), OUT/isoflop_runs.csv (one row per run), OUT/isoflop.png."""
    from opengem.bench.scaling_plot import plot_isoflop

    flat = []
    for r in records:
        row = {k: v for k, v in r.items() if k not in ("valid", "test")}
        row["roles"] = "+".join(r["roles"])
        for k, m in sorted((r["test"] or {}).items()):
            row[f"test_ne[{k}]"] = m.get("ne")
            row[f"test_cal[{k}]"] = m.get("calibration")
        flat.append(row)
    write_rows_csv(out / "isoflop_runs.csv", flat)
    (out / "isoflop.json").write_text(json.dumps(json_safe(result), indent=2, allow_nan=False))
    plot_isoflop(result, records, out / "isoflop.png")
