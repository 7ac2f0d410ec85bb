"""OUT/scaling.png: NE vs forward GFLOP/example (log x), one curve per family, the oracle NE as a floor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from opengem.bench.fit import PowerLaw

COLORS = {"gem": "tab:red", "wukong": "tab:purple", "dlrm": "tab:blue", "dcnv2": "tab:green",
          "din": "tab:orange"}


def plot_scaling(rows: list[dict[str, Any]], fits: dict[str, PowerLaw], oracle: float | None, path: Path,
                 metric: str, examples: dict[str, int]) -> None:
    """Points are measured runs; lines are each family's fitted law, drawn against GFLOP/example.

    Fits are in training FLOPs (C = 3 * forward FLOPs * examples); every size of a family trains on the
    same examples, so C / (3 * examples) maps the law onto GFLOP/example exactly.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for fam in sorted({r["family"] for r in rows}):
        pts = sorted((r for r in rows if r["family"] == fam and not r["proxy"]),
                     key=lambda r: r["gflop_per_example"])
        if not pts:
            continue
        color = COLORS.get(pts[0]["model"], None)
        gx = np.array([r["gflop_per_example"] for r in pts])
        ax.scatter(gx, [r["ne"] for r in pts], color=color, zorder=3)
        label = fam
        if fam in fits:
            f = fits[fam]
            grid = np.geomspace(gx.min() / 1.5, gx.max() * 1.5, 100)
            c_train = grid * 1e9 * 3 * examples[fam]
            label = f"{fam}: {f.a:.3g}·C^{-f.b:.3f} + {f.c:.4f}"
            ax.plot(grid, f(c_train), color=color, label=label)
        else:
            ax.plot(gx, [r["ne"] for r in pts], color=color, label=label, ls="--")
    if oracle is not None:
        ax.axhline(oracle, color="k", ls=":", label=f"oracle NE {oracle:.4f}")
    ax.set_xscale("log")
    ax.set_xlabel("forward GFLOP / example (full sequence length)")
    ax.set_ylabel(f"held-out NE ({metric})")
    ax.set_title("NE vs compute (one pass, same data per size)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_isoflop(result: dict[str, Any], records: list[dict[str, Any]], path: Path) -> None:
    """The iso-FLOP study: NE vs training FLOPs. Small dots: every size at seed 0 (the iso-FLOP curves);
    big dots with 95 % bars: each budget's best size over its seeds (the frontier); lines: fitted laws."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for fam, fr in result["frontier"].items():
        model = next((r["model"] for r in records if r["family"] == fam), fam)
        color = COLORS.get(model)
        pts = [r for r in records if r["family"] == fam and r["seed"] == 0 and "grid" in r["roles"]]
        ax.scatter([r["train_flops"] for r in pts], [r["test_ne"] for r in pts], s=8, color=color, alpha=0.35)
        cs = np.array([p["train_flops"] for p in fr])
        ne = np.array([p["ne"] for p in fr])
        err = np.array([p["ne_ci95"] if p["ne_ci95"] == p["ne_ci95"] else 0.0 for p in fr])
        f = result["fits"].get(fam)
        label = fam if f is None else f"{fam}: {f['a']:.3g}·C^({-f['b']:.3f}) + {f['c']:.4f}"
        ax.errorbar(cs, ne, yerr=err, fmt="o", color=color, capsize=3, zorder=3, label=label)
        if f is not None:
            grid = np.geomspace(cs.min() / 1.5, cs.max() * 1.5, 100)
            ax.plot(grid, PowerLaw(**f)(grid), color=color, lw=1)
    if result.get("oracle_ne") is not None:
        ax.axhline(result["oracle_ne"], color="k", ls=":", label=f"oracle NE {result['oracle_ne']:.4f}")
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs C = 3 x forward FLOPs/example x rows")
    ax.set_ylabel(f"test NE ({result['metric']})")
    ax.set_title("iso-FLOP frontier (each budget's compute-optimal size, 95 % CI over seeds)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
