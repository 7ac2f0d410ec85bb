"""NE vs serving FLOPs per VM surface: every arm of the final transfer-prod run (two processes split by
surface) beside baseline VMs made bigger (baseline-only runs of the same protocol on the same data and FM
versions), so a reader sees whether an arm that adds serving compute (param_sharing runs the FM's sequence
encoder at serving time) beats spending those FLOPs on a bigger VM.
usage: pareto.py OUT_PREFIX ARMS_RUN/transfer.json ... -- BIG_RUN/transfer.json ..."""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out, rest = sys.argv[1], sys.argv[2:]
cut = rest.index("--")
arms_runs, bigs = rest[:cut], rest[cut + 1 :]
points: dict[str, list[tuple[str, float, float, list[float]]]] = {}
for arms_run in arms_runs:
    for arm, per_key in json.load(open(arms_run))["arms"].items():
        for key, m in per_key.items():
            points.setdefault(key, []).append((arm, m["serving_flops"], m["ne"], m["ne_seeds"]))


def val_ne(run: dict, surface: str) -> float:
    """The baseline's validation NE on a surface at its tuned length (the epochs choice's own score)."""
    return min(c["ne_per_surface"][surface] for c in run["epochs_per_window"]["validation_ne"]["baseline"])


# bigger baselines: runs of one size at several learning rates are grouped by serving FLOPs, and per surface
# the rate with the lowest validation NE is kept (the evaluation windows choose nothing)
by_size: dict[float, list[dict]] = {}
for f in bigs:
    run = json.load(open(f))
    fl = next(iter(run["arms"]["baseline"].values()))["serving_flops"]
    by_size.setdefault(fl, []).append(run)
curve: dict[str, list[tuple[float, float, list[float]]]] = {}
chosen_lr: dict[tuple[str, float], float] = {}
for fl, group in by_size.items():
    for key in group[0]["arms"]["baseline"]:
        surface = key.split("/")[0]
        best = min(group, key=lambda r, s=surface: val_ne(r, s))
        m = best["arms"]["baseline"][key]
        curve.setdefault(key, []).append((m["serving_flops"], m["ne"], m["ne_seeds"]))
        chosen_lr[(key, fl)] = best["config"]["train"]["lr"]
lines = [
    "| surface/task | model | serving FLOPs/example | NE (mean of seeds) | NE per seed |",
    "|---|---|---|---|---|",
]
keys = sorted(points)
ncol = min(len(keys), 2)
nrow = (len(keys) + ncol - 1) // ncol
fig, axes = plt.subplots(nrow, ncol, figsize=(6 * ncol, 4.5 * nrow), squeeze=False)
for ax, key in zip(axes.flat, keys):
    arm_pts = sorted(points[key], key=lambda p: p[1])
    base = [p for p in arm_pts if p[0] == "baseline"]
    sizes = sorted([(b[1], b[2], b[3]) for b in base] + curve.get(key, []))
    ax.plot([s[0] for s in sizes], [s[1] for s in sizes], "k-o", label="baseline VM, bigger sizes")
    for arm, fl, ne, _ in arm_pts:
        if arm != "baseline":
            ax.scatter([fl], [ne], zorder=3)
            ax.annotate(arm, (fl, ne), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("serving FLOPs / example")
    ax.set_ylabel("NE (evaluation windows, mean over seeds)")
    ax.set_title(key)
    ax.legend(fontsize=8)
    for fl, ne, seeds in sizes:
        lr = chosen_lr.get((key, fl))
        name = f"baseline {fl:,.0f}" + (f" (lr {lr:g}, chosen on validation)" if lr is not None else "")
        lines.append(f"| {key} | {name} | {fl:,.0f} | {ne:.4f} | {', '.join(f'{x:.4f}' for x in seeds)} |")
    for arm, fl, ne, seeds in arm_pts:
        if arm != "baseline":
            lines.append(f"| {key} | {arm} | {fl:,.0f} | {ne:.4f} | {', '.join(f'{x:.4f}' for x in seeds)} |")
fig.tight_layout()
fig.savefig(out + ".png", dpi=110)
open(out + ".md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
