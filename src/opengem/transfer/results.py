"""Transfer metrics: NE gain, transfer ratio TR, effectiveness ratio R, paired bootstrap CIs, tables, plot.

TR = (NE_base − NE_arm) / (NE_base − NE_FM): the share of the FM's advantage over the baseline VM that
the arm captures. R = gain(arm) / gain(tuned KD) with gain = NE_base − NE_arm, reported only for arms
within +10 % of the baseline VM's serving FLOPs (``aggregate.apply_equal_flops_rule``; the table shows the
FLOPs ratio, and "adds serving compute" in place of R for the others). Across seeds, gains are averaged
before the ratio (a ratio of means, stable when one seed's KD gain is tiny). CIs: paired
bootstrap — each replicate resamples the evaluated examples of every seed (the same rows for every
arm), recomputes every NE, and the ratio of summed gains; percentiles 2.5 / 97.5.

R is withheld (``r_withheld = KD_GAIN_UNRESOLVED``) where tuned KD's own gain has a CI that includes 0: the
ratio's denominator is then indistinguishable from nothing and the session-8 final seeds printed
R = -269 [-1698, 1977] for such a surface. TR still measures the arm against the FM there.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

EPS = 1e-7
KD_GAIN_UNRESOLVED = "undefined: KD's gain CI includes 0"


def ne_of(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, EPS, 1 - EPS)
    if y.size == 0:
        return float("nan")
    r = y.mean()
    if r <= 0 or r >= 1:
        return float("nan")
    h = -(r * math.log(r) + (1 - r) * math.log(1 - r))
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)) / h)


def ne_boot(p: np.ndarray, y: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """NE for each bootstrap row of indices idx [R, N] (vectorised)."""
    p = np.clip(p, EPS, 1 - EPS)
    ll = -(y * np.log(p) + (1 - y) * np.log(1 - p))
    yy = y[idx]
    r = np.clip(yy.mean(1), EPS, 1 - EPS)
    h = -(r * np.log(r) + (1 - r) * np.log(1 - r))
    return ll[idx].mean(1) / h


def ratio(num: float, den: float) -> float | None:
    if den == 0 or not math.isfinite(num) or not math.isfinite(den):
        return None
    return num / den


def summarize_key(
    per_seed: list[dict[str, dict[str, np.ndarray]]],
    arms: list[str],
    base: str,
    kd: str,
    n_boot: int = 200,
    rng_seed: int = 0,
) -> dict[str, Any]:
    """per_seed[i][arm] = {"p", "y"} on the same rows (plus arm "fm"); returns per-arm stats for one key.
    Without the ``kd`` arm (a baseline-only run, e.g. the bigger baseline VMs of a Pareto comparison) R and
    its CI are None; NE, gain and TR are still measured."""
    ne = {a: np.array([ne_of(s[a]["p"], s[a]["y"]) for s in per_seed]) for a in [*arms, "fm"]}
    mean = {a: float(np.nanmean(v)) for a, v in ne.items()}
    rng = np.random.default_rng(rng_seed)
    boot = {a: np.zeros(n_boot) for a in [*arms, "fm"]}
    for s in per_seed:
        n = len(s[base]["y"])
        idx = rng.integers(0, n, size=(n_boot, n))
        for a in [*arms, "fm"]:
            boot[a] += ne_boot(s[a]["p"], s[a]["y"], idx) / len(per_seed)
    out: dict[str, Any] = {"fm": {"ne": mean["fm"]}}
    g_kd = mean[base] - mean[kd] if kd in mean else float("nan")
    g_fm = mean[base] - mean["fm"]
    kd_unresolved = False
    if kd in boot:
        gb = boot[base] - boot[kd]
        kd_unresolved = bool(np.percentile(gb, 2.5) <= 0 <= np.percentile(gb, 97.5))
    for a in arms:
        g = mean[base] - mean[a]
        rb = np.zeros(0)
        if kd in boot:
            rb = (boot[base] - boot[a]) / np.where(boot[base] - boot[kd] == 0, np.nan, boot[base] - boot[kd])
            rb = rb[np.isfinite(rb)]
        tb = (boot[base] - boot[a]) / np.where(boot[base] == boot["fm"], np.nan, boot[base] - boot["fm"])
        tb = tb[np.isfinite(tb)]
        out[a] = {
            "ne": mean[a],
            "ne_seeds": [float(x) for x in ne[a]],
            "ne_gain": ratio(g, mean[base]),  # relative NE gain vs the baseline VM
            "tr": ratio(g, g_fm),
            "r": ratio(g, g_kd),
            "r_ci": [float(np.percentile(rb, 2.5)), float(np.percentile(rb, 97.5))] if rb.size else None,
            # TR's own paired bootstrap CI (rows resampled, the same rows for the arm, baseline and FM):
            # how well the evaluated rows resolve TR (the calibration band is 0.35 wide)
            "tr_ci": [float(np.percentile(tb, 2.5)), float(np.percentile(tb, 97.5))] if tb.size else None,
            "fm_ne": mean["fm"],
        }
        if kd_unresolved:
            out[a].update(r=None, r_ci=None, r_withheld=KD_GAIN_UNRESOLVED)
    return out


def fmt(x: Any, nd: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(fmt(v, 2) for v in x) + "]"
    return f"{x:.{nd}f}"


def arms_table(res: dict[str, Any], arms: list[str]) -> str:
    keys = sorted({k for a in arms for k in res["arms"].get(a, {})})
    head = (
        f"{'arm':<18}{'surface/task':<22}{'NE':>8}{'gain%':>8}{'AUC':>8}{'calib':>7}{'FM NE':>8}{'TR':>8}"
        f"{'FLOPs x':>8}{'R':>8}  R 95% CI"
    )
    lines = [head, "-" * (len(head) + 8)]
    for a in arms:
        for k in keys:
            m = res["arms"].get(a, {}).get(k)
            if not m:
                continue
            gain = None if m.get("ne_gain") is None else 100 * m["ne_gain"]
            lines.append(
                f"{a:<18}{k:<22}{fmt(m['ne']):>8}{fmt(gain, 2):>8}{fmt(m.get('auc')):>8}"
                f"{fmt(m.get('calibration'), 2):>7}{fmt(m.get('fm_ne')):>8}{fmt(m.get('tr'), 2):>8}"
                f"{fmt(m.get('serving_flops_ratio'), 2):>8}"
                + (f"{'-':>8}  {m['r_withheld']}" if m.get("r_withheld") else
                   f"{fmt(m.get('r'), 2):>8}  {fmt(m.get('r_ci'))}")
            )
    return "\n".join(lines)


def staleness_table(sweep: dict[str, dict[str, dict[str, Any]]]) -> str:
    lags = sorted(sweep, key=int)
    arms = sorted({a for v in sweep.values() for a in v})
    head = f"{'arm (TR, mean over surfaces)':<30}" + "".join(f"{'lag ' + str(lag):>10}" for lag in lags)
    lines = [head, "-" * len(head)]
    for a in arms:
        row = f"{a:<30}"
        for lag in lags:
            vals = [m["tr"] for m in sweep[lag].get(a, {}).values() if m.get("tr") is not None]
            row += f"{fmt(float(np.mean(vals)) if vals else None, 2):>10}"
        lines.append(row)
    return "\n".join(lines)


def staleness_plot(sweep: dict[str, dict[str, dict[str, Any]]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lags = sorted(sweep, key=int)
    arms = sorted({a for v in sweep.values() for a in v})
    fig, ax = plt.subplots(figsize=(6, 4))
    for a in arms:
        ys = []
        for lag in lags:
            vals = [m["tr"] for m in sweep[lag].get(a, {}).values() if m.get("tr") is not None]
            ys.append(float(np.mean(vals)) if vals else np.nan)
        ax.plot([int(x) for x in lags], ys, marker="o", label=a)
    ax.set_xlabel("FM staleness (versions behind, windows)")
    ax.set_ylabel("transfer ratio TR")
    ax.axhline(0, color="grey", lw=0.5)
    ax.legend(fontsize=8)
    ax.set_title("Transfer ratio vs FM staleness")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
