"""LR vs GEM vs DCNv2 on small, shifted categorical data (issue 11 acceptance): no deep model may lose to
logistic regression by a significant margin; and the real-data table of issue 14 (every family at its own
tuned learning rate, >= 5 seeds, GEM minus each baseline with a paired 95 % CI):

    .venv/bin/python benchmarks/lr_compare.py                  # movielens_100k and frappe_x1, 3 seeds
    .venv/bin/python benchmarks/lr_compare.py --datasets frappe_x1,kuairand_pure \
        --models gem,lr,dcnv2,dlrm,wukong --seeds 0,1,2,3,4   # issue 14's real-data table
    options: --out DIR (default runs/lr_compare), --datasets a,b, --models a,b, --seeds 0,1,2,
             --scales 0.3,1,3 (learning-rate grid), --extend N (default 0), --epochs N (0 = the recipe's),
             --jobs N (default 2), --table-only, then section.key=value overrides for every run

Every (dataset, model, seed, lr) is one process of ``benchmarks/quality_harness.py`` (the one Trainer,
early stopping on ``valid`` by AUC with patience 2, test metrics of the best validation epoch) writing one
JSON file; a result that exists is reused, so an interrupted comparison resumes. All models of a dataset
read one recipe (configs/frappe.toml, configs/movielens.toml) and the same epoch budget; only
``model.name`` and the rates differ.

Learning rate: each scale s of the grid multiplies *both* a dense and a sparse base rate (``DATASETS``: the
recipe's ``train.lr`` and ``train.sparse_lr`` when the committed tables ran; the recipes now carry their own
model's tuned rates). LR is nearly all table rows, the deep models mostly dense weights: one knob moves
both. The grid runs on the first seed; per (dataset, model) the scale with the lowest validation NE wins
(never test), and the other seeds run at it. With ``--extend N`` (the iso-FLOP study's ``lr_extend``), a
winner on an edge of the scales tried gets one more scale past that edge on the first seed (0.3, 1, 3 -> 10
or 0.1), up to N times, before the other seeds run. Two selection rules are reported from the same runs: the
epoch of best validation AUC (the harness's, as BARS reports frappe) and the epoch of lowest validation
NE (read from the per-epoch history, which scores test after every epoch); each rule picks its own scale,
and the other seeds run at both winners. Data: converted with the named adapters from
``../shared/data`` (or $OPENGEM_DATA) into --out; movielens_100k's adapter splits by global time
quantiles 80/10/10 (train < valid < test in time), frappe_x1 is BARS's random split.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
SHARED = Path(os.environ.get("OPENGEM_DATA", REPO.parent / "shared" / "data"))
sys.path.insert(0, str(REPO / "src"))

from opengem.bench.fit import mean_ci  # noqa: E402
from opengem.bench.isoflop_rule import next_rate  # noqa: E402

# "lr" / "sparse_lr": what scale 1 of the grid means, the recipe's own rates when every committed table ran
# (sessions 4-35); the recipes have since moved to their model's tuned rates, and the grid's base stays put
DATASETS: dict[str, dict[str, Any]] = {
    # the slowest first
    "kuairand_pure": {"config": "configs/kuairand.toml", "tasks": ["is_click", "long_view", "is_like"],
                      "lr": 3e-3, "sparse_lr": 0.05},
    "movielens_100k": {"config": "configs/movielens.toml", "tasks": ["like"], "lr": 1e-3, "sparse_lr": 0.05},
    "frappe_x1": {"config": "configs/frappe.toml", "tasks": ["click"], "lr": 1e-3, "sparse_lr": 0.05},
}
MODELS = ["lr", "gem", "dcnv2"]
# epoch (and lr) selection rules, both on validation: the harness's AUC, and NE (what a calibrated
# probability needs; on frappe the deep models' validation NE rises for epochs while their AUC still climbs)
SELECT = ("auc", "ne")


def ensure_data(name: str, out: Path) -> Path:
    """The dataset converted by its named adapter into ``out/name`` (reused when complete)."""
    path = out / name
    if not (path / "_COMPLETE").exists():
        src = SHARED / name
        if not src.exists():
            raise SystemExit(f"lr_compare: {src} is missing (set OPENGEM_DATA to the folder of {name})")
        cmd = [str(REPO / ".venv/bin/opengem"), "convert", name, "--src", str(src), "--out", str(path)]
        subprocess.run(cmd, check=True)
    return path


def result_path(out: Path, ds: str, model: str, seed: int, scale: float) -> Path:
    return out / "results" / ds / f"{model}_x{scale:g}_seed{seed}.json"


def base_rates(ds: str) -> tuple[float, float]:
    """The dense and the sparse rate that scale 1 of the grid means for ``ds``."""
    return DATASETS[ds]["lr"], DATASETS[ds]["sparse_lr"]


def command(ds: str, data: Path, res: Path, model: str, seed: int, scale: float, epochs: int,
            extra: list[str]) -> list[str]:
    lr, sparse_lr = base_rates(ds)
    return harness_command(ds, data, res, model, seed, lr * scale, sparse_lr * scale, epochs, extra)


def harness_command(ds: str, data: Path, res: Path, model: str, seed: int, lr: float, sparse_lr: float,
                    epochs: int, extra: list[str]) -> list[str]:
    """One run of the harness at a dense and a sparse rate (``command`` moves both by one scale)."""
    return [
        PY, str(REPO / "benchmarks/quality_harness.py"), "--config", DATASETS[ds]["config"],
        "--data", str(data), "--out", str(res), "--train", "train", "--valid", "valid", "--test", "test",
        "--epochs", str(epochs),
        f"model.name={model}", f"train.seed={seed}", f"train.lr={lr:g}", f"train.sparse_lr={sparse_lr:g}",
        *extra,
    ]


def _ne(split: dict[str, Any]) -> float:
    """Mean over tasks of the all-surface NE of one evaluation."""
    nes = [v["ne"] for k, v in split["metrics"].items() if k.startswith("all/") and v["ne"] == v["ne"]]
    return float(np.mean(nes)) if nes else float("inf")


def chosen_epoch(result: dict[str, Any], select: str) -> dict[str, Any]:
    """The epoch a rule keeps, as the harness's history record: "auc" = the harness's own choice (best
    validation AUC, as BARS reports), "ne" = the lowest validation NE among the epochs the run trained
    (the harness scores test after every epoch, so no rerun is needed)."""
    if select == "auc":
        return next(h for h in result["history"] if h["epoch"] == result["best_epoch"])
    return min(result["history"], key=lambda h: _ne(h["valid"]))


def valid_ne(result: dict[str, Any], select: str) -> float:
    """What the grid minimises: validation NE at the epoch ``select`` keeps (never test)."""
    return _ne(chosen_epoch(result, select)["valid"])


def load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def tried_scales(out: Path, ds: str, model: str, seed: int, scales: list[float]) -> list[float]:
    """The grid plus the scales ``--extend`` added beyond its edges (found as result files), ascending."""
    found = {float(p.name.split("_x", 1)[1].rsplit("_seed", 1)[0])
             for p in (out / "results" / ds).glob(f"{model}_x*_seed{seed}.json")}
    return sorted(set(scales) | found)


def best_scale(out: Path, ds: str, model: str, seed: int, scales: list[float], select: str) -> float | None:
    tried = tried_scales(out, ds, model, seed, scales)
    scores = {s: valid_ne(r, select) for s in tried if (r := load(result_path(out, ds, model, seed, s)))}
    return min(scores, key=scores.get) if scores else None


def beyond_edge(out: Path, ds: str, model: str, seed: int, scales: list[float], select: str) -> float | None:
    """The scale one grid step past the edge the rule's best sits on (None: bracketed, or not trained yet)."""
    runs = {s: r for s in tried_scales(out, ds, model, seed, scales)
            if (r := load(result_path(out, ds, model, seed, s)))}
    return next_rate(sorted(runs), {s: valid_ne(r, select) for s, r in runs.items()})


def run_all(args: argparse.Namespace, data: dict[str, Path], out: Path) -> None:
    """Grid jobs first (longest datasets first); a (dataset, model)'s other seeds as soon as its grid is in.
    At most ``args.jobs`` processes at a time."""

    def job(ds: str, model: str, seed: int, scale: float) -> list[str] | None:
        res = result_path(out, ds, model, seed, scale)
        if res.exists():
            return None
        return command(ds, data[ds], res, model, seed, scale, args.epochs, args.overrides)

    def run(cmd: list[str]) -> None:
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)

    grid_seed, others = args.seeds[0], args.seeds[1:]
    pairs = sorted(((ds, m) for ds in args.datasets for m in args.models),  # slowest first
                   key=lambda p: (list(DATASETS).index(p[0]), p[1] != "gem"))
    pending: dict[tuple[str, str], set[Future]] = {}
    with ThreadPoolExecutor(max(args.jobs, 1)) as pool:
        for ds, m in pairs:
            cmds = [c for s in args.scales if (c := job(ds, m, grid_seed, s))]
            pending[(ds, m)] = {pool.submit(run, c) for c in cmds}
        live = {f for fs in pending.values() for f in fs}
        seeded: set[tuple[str, str]] = set()
        extended: dict[tuple[str, str], int] = {}
        while True:
            for pair, fs in pending.items():
                if pair in seeded or any(not f.done() for f in fs):
                    continue
                for f in fs:
                    f.result()  # a failed run stops the comparison here, with its error
                beyond = {b for select in SELECT
                          if (b := beyond_edge(out, *pair, grid_seed, args.scales, select)) is not None}
                if beyond and extended.get(pair, 0) < args.extend:  # the best is an edge: one step past it
                    extended[pair] = extended.get(pair, 0) + 1
                    pending[pair] = {pool.submit(run, c) for b in beyond if (c := job(*pair, grid_seed, b))}
                    live |= pending[pair]
                    continue
                seeded.add(pair)
                bests = {best_scale(out, *pair, grid_seed, args.scales, select) for select in SELECT}
                bests.discard(None)  # once each: the two rules often pick the same scale
                for best in sorted(bests):
                    for s in others:
                        if c := job(*pair, s, best):
                            live.add(pool.submit(run, c))
            live = {f for f in live if not f.done()}
            if not live and len(seeded) == len(pending):
                break
            if live:
                wait(live, return_when=FIRST_COMPLETED)


def ms(xs: list[float]) -> str:
    xs = [x for x in xs if x == x]
    if not xs:
        return "n/a"
    return f"{np.mean(xs):.4f} ± {np.std(xs, ddof=1):.4f}" if len(xs) > 1 else f"{xs[0]:.4f}"


def tables(args: argparse.Namespace, out: Path) -> str:
    lines = []
    for ds in args.datasets:
        for select in SELECT:
            lines += table(args, out, ds, select)
    loads = [r["loadavg"] for f in sorted(out.glob("results/*/*.json")) if (r := load(f))]
    if loads:
        la = np.array(loads)
        lines.append(f"\nload average (1 min) at the end of the runs: min {la[:, 0].min():.2f}, "
                     f"max {la[:, 0].max():.2f}; {len(loads)} runs")
    return "\n".join(lines)


def paired_ci(d: np.ndarray) -> str:
    """Mean of paired differences with a 95 % t interval over seeds (the seeds are the replicates)."""
    mean, half = mean_ci(d.tolist())
    if len(d) < 2:
        return f"{mean:+.4f}"
    return f"{mean:+.4f} [{mean - half:+.4f}, {mean + half:+.4f}]"


def table(args: argparse.Namespace, out: Path, ds: str, select: str) -> list[str]:
    base_lr, base_sparse = base_rates(ds)
    lines: list[str] = []
    for name in DATASETS[ds]["tasks"]:
        task = f"all/{name}"
        lines += [f"\n== {ds} ({DATASETS[ds]['config']}): test {task} at the epoch of best validation "
                  f"{select.upper()} (lr grid: validation NE at that epoch), mean ± std over seeds",
                  f"{'model':<7}{'lr x':>6}{'lr':>9}{'sparse_lr':>10}{'n':>3}{'MFLOP/ex':>10}"
                  f"{'test AUC':>20}{'test NE':>20}{'epochs':>16}"]
        test: dict[str, dict[int, dict[str, float]]] = {}
        for m in args.models:
            best = best_scale(out, ds, m, args.seeds[0], args.scales, select)
            rs = {s: r for s in args.seeds
                  if best is not None and (r := load(result_path(out, ds, m, s, best)))}
            if not rs:
                lines.append(f"{m:<7}  no results yet")
                continue
            recs = {s: chosen_epoch(r, select) for s, r in rs.items()}
            test[m] = {s: h["test"]["metrics"][task] for s, h in recs.items()}
            first = next(iter(rs.values()))
            lines.append(
                f"{m:<7}{best:>6g}{base_lr * best:>9.2g}{base_sparse * best:>10.2g}{len(rs):>3}"
                f"{first['flops_per_example'] / 1e6:>10.3f}{ms([t['auc'] for t in test[m].values()]):>20}"
                f"{ms([t['ne'] for t in test[m].values()]):>20}"
                f"{','.join(str(h['epoch']) for h in recs.values()):>16}")
        ref = "gem" if "gem" in test else next(iter(test), None)
        for m in (m for m in test if m != ref and ref is not None):
            seeds = sorted(set(test[m]) & set(test[ref]))
            if not seeds:
                continue
            parts = []
            for k in ("auc", "ne"):
                d = np.array([test[ref][s][k] - test[m][s][k] for s in seeds])
                parts.append(f"{k.upper()} {paired_ci(d)}")
            lines.append(f"  {ref} - {m} on test, paired by seed (n={len(seeds)}, 95 % t CI): "
                         + ", ".join(parts))
    lines.append(f"  lr grid, seed {args.seeds[0]}: validation NE at the chosen epoch (lower wins)")
    for m in args.models:
        scales = tried_scales(out, ds, m, args.seeds[0], args.scales)
        grid = [load(result_path(out, ds, m, args.seeds[0], s)) for s in scales]
        row = [f"x{s:g} " + (f"{valid_ne(r, select):.4f}" if r else "-") for s, r in zip(scales, grid)]
        lines.append(f"  {m:<7}" + "   ".join(row))
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(REPO / "runs" / "lr_compare"))
    p.add_argument("--datasets", default="movielens_100k,frappe_x1")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--scales", default="0.3,1,3")
    p.add_argument("--epochs", type=int, default=0, help="0 = train.epochs of the recipe")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (each one process, one thread)")
    p.add_argument("--extend", type=int, default=0,
                   help="while a model's best scale is an edge of those tried, try up to N steps past it")
    p.add_argument("--table-only", action="store_true")
    p.add_argument("overrides", nargs="*", help="extra section.key=value for every run")
    args = p.parse_args(argv)
    args.datasets = args.datasets.split(",")
    unknown = [d for d in args.datasets if d not in DATASETS]
    if unknown:
        p.error(f"unknown dataset(s) {unknown}; known: {', '.join(DATASETS)}")
    args.models = args.models.split(",")
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.scales = [float(s) for s in args.scales.split(",")]
    out = Path(args.out)
    if not args.table_only:
        data = {ds: ensure_data(ds, out) for ds in args.datasets}
        run_all(args, data, out)
    print(tables(args, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
