"""NE vs serving FLOPs per VM surface: every arm of the KuaiRand-Pure transfer run beside baseline VMs made
bigger (baseline-only runs of the same protocol on the same FM versions), so a reader sees whether an arm
that adds serving compute (param_sharing runs FM blocks at serving time) beats spending those FLOPs on a
bigger VM. usage: pareto.py ARMS_RUN/transfer.json OUT_PREFIX BIG_RUN/transfer.json ..."""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

arms_run, out, bigs = sys.argv[1], sys.argv[2], sys.argv[3:]
main = json.load(open(arms_run))
points: dict[str, list[tuple[str, float, float, list[float]]]] = {}
for arm, per_key in main["arms"].items():
    for key, m in per_key.items():
        points.setdefault(key, []).append((arm, m["serving_flops"], m["ne"], m["ne_seeds"]))
curve: dict[str, list[tuple[float, float, list[float]]]] = {}
for f in bigs:
    for key, m in json.load(open(f))["arms"]["baseline"].items():
        curve.setdefault(key, []).append((m["serving_flops"], m["ne"], m["ne_seeds"]))
lines = [
    "| surface/task | model | serving FLOPs/example | NE (mean of seeds) | NE per seed |",
    "|---|---|---|---|---|",
]
keys = sorted(points)
fig, axes = plt.subplots(1, len(keys), figsize=(6 * len(keys), 4.5), squeeze=False)
for ax, key in zip(axes[0], keys):
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
        lines.append(
            f"| {key} | baseline {fl:,.0f} | {fl:,.0f} | {ne:.4f} | {', '.join(f'{x:.4f}' for x in seeds)} |"
        )
    for arm, fl, ne, seeds in arm_pts:
        if arm != "baseline":
            lines.append(f"| {key} | {arm} | {fl:,.0f} | {ne:.4f} | {', '.join(f'{x:.4f}' for x in seeds)} |")
fig.tight_layout()
fig.savefig(out + ".png", dpi=110)
open(out + ".md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
