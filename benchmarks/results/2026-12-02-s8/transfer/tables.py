"""Markdown tables of the final transfer-prod run, which ran as two processes split by VM surface (every
tuning choice is per surface, so the split changes only the wall time). usage: tables.py OUT.md
A/transfer.json B/transfer.json"""

import json
import sys

LABEL = {
    "baseline": "baseline",
    "kd": "KD (tuned)",
    "aux_head": "+ aux head",
    "student_adapter": "+ student adapter",
    "fm_embeddings": "+ FM embeddings",
    "param_sharing": "parameter sharing",
    "hierarchical": "hierarchical",
}


def f(x: float | None, nd: int = 4) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def ci(c: list[float] | None, nd: int = 2) -> str:
    return "-" if not c else f"[{c[0]:.{nd}f}, {c[1]:.{nd}f}]"


out, runs = sys.argv[1], [json.load(open(p)) for p in sys.argv[2:]]
lines = [
    "## Calibration check on the final seeds' validation windows (tuned KD's TR, pooled over seeds)",
    "",
    "| surface/task | rows | baseline NE | KD NE | FM NE | KD TR [95 % CI] | per seed |",
    "|---|---|---|---|---|---|---|",
]
for d in runs:
    for k, m in d["calibration"].items():
        per = ", ".join(f"{p['kd_tr']:.2f}" for p in m.get("per_seed") or [] if p is not None)
        lines.append(
            f"| {k} | {m['rows']} | {f(m['baseline_ne'])} | {f(m['kd_ne'])} | {f(m['fm_ne'])} | "
            f"{f(m['kd_tr'], 2)} {ci(m.get('kd_tr_ci'))} | {per} |"
        )
lines += [
    "",
    "## Arms on the evaluation windows (R = gain / tuned KD's gain; paired bootstrap over seeds and rows)",
    "",
    "| surface/task | arm | NE | NE per seed | gain % | TR [95 % CI] | R [95 % CI] | serving FLOPs "
    "| x baseline |",
    "|---|---|---|---|---|---|---|---|---|",
]
for d in runs:
    arms = d["arms"]
    for key in sorted(next(iter(arms.values()))):
        kd_ci = arms["kd"][key].get("tr_ci")
        kd_resolved = bool(kd_ci) and kd_ci[0] > 0  # R divides by KD's gain: undefined when it may be <= 0
        for a, per_key in arms.items():
            m = per_key[key]
            eq = m["serving_flops_ratio"] is not None and m["serving_flops_ratio"] <= 1.1
            if a == "kd":
                r = "1"
            elif not eq:
                r = "adds serving compute"
            elif a == "baseline" or m.get("r") is None:
                r = "-"
            elif not kd_resolved:
                r = f"undefined (KD's gain CI includes 0; {m['r']:.2f} {ci(m.get('r_ci'))})"
            else:
                r = f"**{m['r']:.2f}** {ci(m.get('r_ci'))}"
            seeds = ", ".join(f"{x:.4f}" for x in m["ne_seeds"])
            lines.append(
                f"| {key} | {LABEL.get(a, a)} | {f(m['ne'])} | {seeds} | {100 * m['ne_gain']:.2f} | "
                f"{f(m['tr'], 2)} {ci(m.get('tr_ci'))} | {r} | {m['serving_flops']:,.0f} | "
                f"{m['serving_flops_ratio']:.2f} |"
            )
lines += [
    "",
    "## Staleness sweep: TR (and the arm's NE) per arm and lag (FM versions behind the freshest allowed one)",
    "",
]
lags = sorted(runs[0]["staleness"], key=int)
if lags:
    lines += [
        "| surface/task | arm | " + " | ".join(f"lag {g}" for g in lags) + " |",
        "|---|---|" + "---|" * len(lags),
    ]
    for d in runs:
        sw = d["staleness"]
        for a in sw[lags[0]]:
            for key in sorted(sw[lags[0]][a]):
                lines.append(
                    f"| {key} | {LABEL.get(a, a)} | "
                    + " | ".join(f"{f(sw[g][a][key]['tr'], 2)} ({f(sw[g][a][key]['ne'])})" for g in lags)
                    + " |"
                )
lines += ["", "## Tuned choices (validation windows, pooled over the first tune_seeds seeds)", ""]
for d in runs:
    t = d["kd_tuned"]
    lines.append(f"- KD point per surface: {json.dumps(t.get('surfaces'))}")
    lines.append(f"- epochs per window: {json.dumps(d['epochs_per_window']['chosen'])}")
lines += ["", "## Regime (first seed)", ""]
for d in runs:
    g = d["regime"]
    for s, m in g["surfaces"].items():
        lines.append(
            f"- {s}: FM/VM training rows >= {m['min_fm_over_vm_rows']:.1f}x, FM/VM serving FLOPs "
            f"{m['fm_over_vm_flops']:.1f}x (VM {m['vm_flops_per_example']:,}, FM "
            f"{g['fm_flops_per_example']:,}); versions every {g['publish_every']} window, lag {g['lag']}"
        )
lines.append("")
lines.append("run seconds: " + ", ".join(f"{d['seconds']:.0f}" for d in runs))
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
