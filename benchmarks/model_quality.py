"""Model quality benchmarks: GEM vs DLRM / DCNv2 (/ DIN) at roughly equal FLOPs, on simulated and real data.

    .venv/bin/python benchmarks/model_quality.py sim        # small recipe: NE per surface x task + oracle
    .venv/bin/python benchmarks/model_quality.py kuairand   # KuaiRand-Pure, 3 seeds: AUC / NE per task
    .venv/bin/python benchmarks/model_quality.py frappe     # Frappe_x1, 3 seeds, early stopping: test AUC
    .venv/bin/python benchmarks/model_quality.py throughput # examples/s and peak RSS, GEM-small vs DLRM
    options: --out DIR (results, default runs/model_quality), --seeds 0,1,2, --models a,b, --table-only,
             --data DIR (dataset; default: simulated / converted into --out from /work/shared/data),
             --jobs N (runs at a time), --best-lr-seeds 1,2,3,4 (sim: seeds rerun at each best lr; none),
             --lrs 1e-3,3e-3 (the lr grid)

Every (model, seed) is one process (benchmarks/quality_harness.py) writing one JSON file; a result that
already exists is reused, so an interrupted benchmark resumes, and ``--table-only`` reprints the tables.
All models of a benchmark read the same recipe, data, steps and tuning; only ``model.name`` differs, and
the recipe sizes the baselines to about GEM's forward FLOPs/example (printed in every table).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
SHARED = Path(os.environ.get("OPENGEM_DATA", REPO.parent / "shared" / "data"))

BENCHES: dict[str, dict[str, Any]] = {
    "sim": {
        "config": "configs/small.toml",
        "models": ["gem", "dlrm", "dcnv2"],
        "seeds": [0],
        "train": "day=00[0-4]",  # days 0-4 train, day 5 picks the lr, day 6 is the test
        "valid": "day=005",
        "test": "day=006",
        "epochs": 0,
        "lrs": [1e-3, 3e-3, 1e-2, 3e-2],
        "best_lr_seeds": [1, 2, 3, 4],  # after the grid on seed 0: each best lr again with these seeds
    },
    "kuairand": {
        "config": "configs/kuairand.toml",
        "models": ["gem", "dcnv2", "dlrm", "din"],
        "seeds": [0, 1, 2],
        "train": "train",
        "valid": "",
        "test": "test",
        "epochs": 0,
    },
    "frappe": {
        "config": "configs/frappe.toml",
        "models": ["wukong", "dcnv2", "dlrm"],
        "seeds": [0, 1, 2],
        "train": "train",
        "valid": "valid",
        "test": "test",
        "epochs": 0,
    },
    "throughput": {
        "config": "configs/small.toml",
        "models": ["gem", "dlrm"],
        "seeds": [0],
        "train": "@all_but_last",
        "valid": "",
        "test": "@last",
        "epochs": 1,
        "extra": ["train.steps=120"],
    },
}
BARS_FRAPPE = {
    "dcnv2": 0.9845,
    "dlrm": 0.9840,
    "wukong": 0.9868,
}  # BARS Frappe_x1 test AUC (full train split)


def ensure_data(bench: str, out: Path, data: str | None, config: str) -> Path:
    if data:
        return Path(data)
    if bench in ("sim", "throughput"):
        sys.path.insert(0, str(REPO / "src"))
        from opengem.train.config import load_run_config
        from opengem.train.data import prepare_data

        return prepare_data(load_run_config(REPO / config).data, out / "sim")  # reused when unchanged
    name = {"kuairand": "kuairand_pure", "frappe": "frappe_x1"}[bench]
    path = out / name
    if not (path / "schema.toml").exists():
        subprocess.run(
            [
                str(REPO / ".venv/bin/opengem"),
                "convert",
                name,
                "--src",
                str(SHARED / name),
                "--out",
                str(path),
            ],
            check=True,
        )
    return path


def result_path(out: Path, bench: str, m: str, s: int, lr: float | None) -> Path:
    return out / bench / (f"{m}_lr{lr:g}_seed{s}.json" if lr is not None else f"{m}_seed{s}.json")


def run_jobs(
    bench: str,
    spec: dict[str, Any],
    data: Path,
    out: Path,
    models: list[str],
    seeds: list[int],
    extra: list[str],
    only_lr: dict[str, float] | None = None,
    jobs: int = 1,
) -> None:
    cmds = []
    for m in models:
        for lr in [only_lr[m]] if only_lr else spec.get("lrs", [None]):
            for s in seeds:
                res = result_path(out, bench, m, s, lr)
                if res.exists():
                    continue
                cmd = [
                    PY,
                    str(REPO / "benchmarks/quality_harness.py"),
                    "--config",
                    spec["config"],
                    "--data",
                    str(data),
                    "--out",
                    str(res),
                    "--train",
                    spec["train"],
                    "--valid",
                    spec["valid"],
                    "--test",
                    spec["test"],
                    "--epochs",
                    str(spec["epochs"]),
                    f"model.name={m}",
                    f"train.seed={s}",
                    *spec.get("extra", []),
                    *extra,
                ]
                cmd += [f"train.lr={lr:g}"] if lr is not None else []
                cmds.append(cmd)

    def one(cmd: list[str]) -> None:
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=REPO)

    with ThreadPoolExecutor(max(jobs, 1)) as pool:  # one process per run; threads only wait
        list(pool.map(one, cmds))


def load(
    out: Path, bench: str, models: list[str], seeds: list[int], lr: float | None = None
) -> dict[str, list[dict[str, Any]]]:
    res: dict[str, list[dict[str, Any]]] = {}
    for m in models:
        for s in seeds:
            f = result_path(out, bench, m, s, lr)
            if f.exists():
                res.setdefault(m, []).append(json.loads(f.read_text()))
    return res


def _lr_of(result: dict[str, Any]) -> float:
    return float(next(o.split("=")[1] for o in result["overrides"] if o.startswith("train.lr=")))


def selection_ne(result: dict[str, Any]) -> float:
    """What the lr grid minimises: the mean over tasks of the all-surface NE on the validation split
    (the test split only where a benchmark has no validation split)."""
    split = result.get("valid") or result["test"]
    nes = [v["ne"] for k, v in split["metrics"].items() if k.startswith("all/") and v["ne"] == v["ne"]]
    return float(np.mean(nes))


def best_lr(
    out: Path, bench: str, models: list[str], seeds: list[int], lrs: list[float]
) -> tuple[dict[str, list[dict[str, Any]]], str]:
    """Per model the lr with the lowest :func:`selection_ne` for the FIRST seed (the grid is run on it
    alone), then every seed's result at that lr; and the grid as a text table."""
    lines = [
        f"lr grid (mean all-surface NE over tasks on the validation day, seed {seeds[0]}; the table above "
        "uses each model's best lr, with every seed run at it)",
        f"{'model':<8}" + "".join(f"{'lr ' + format(lr, 'g'):>12}" for lr in lrs),
    ]
    best: dict[str, list[dict[str, Any]]] = {}
    for m in models:
        row, scores = f"{m:<8}", {}
        for lr in lrs:
            r = load(out, bench, [m], seeds[:1], lr).get(m)
            if r:
                scores[lr] = selection_ne(r[0])
            row += f"{scores.get(lr, float('nan')):>12.4f}"
        if scores:
            best[m] = load(out, bench, [m], seeds, min(scores, key=scores.get))[m]
        lines.append(row)
    return best, "\n".join(lines)


def ms(xs: list[float], digits: int = 4) -> str:
    xs = [x for x in xs if x == x]
    if not xs:
        return "n/a"
    if len(xs) == 1:
        return f"{xs[0]:.{digits}f}"
    return f"{np.mean(xs):.{digits}f} ± {np.std(xs, ddof=1):.{digits}f}"


def pooled_oracle_ne(data: Path, partitions: str) -> dict[str, float]:
    """Oracle NE of "all/<task>": every surface's rows pooled (one base rate), as the models' all/ rows."""
    import pyarrow.parquet as pq

    from opengem.data.dataset import Dataset
    from opengem.data.oracle import NEAccumulator

    ds = Dataset(data)
    acc = NEAccumulator()
    for f, tf in zip(ds.files(partitions), ds.truth_files(partitions), strict=True):
        lab, tru = pq.read_table(f), pq.read_table(tf)
        for t in ds.schema.tasks:
            y = lab[t.label_column]
            obs = ~np.asarray(y.is_null().to_numpy(zero_copy_only=False))
            acc.update(f"all/{t.name}", tru[f"p_{t.name}"].to_numpy(), y.fill_null(0).to_numpy(), obs)
    return acc.results()


def table_sim(res: dict[str, list[dict[str, Any]]], data: Path) -> str:
    from opengem.data.oracle import oracle_ne

    oracle = oracle_ne(data, "@last")
    oracle.update(pooled_oracle_ne(data, "@last"))
    models = list(res)
    keys = sorted(
        {k for r in res.values() for k in r[0]["test"]["metrics"]}, key=lambda k: (k.startswith("all/"), k)
    )
    head = (
        f"{'surface/task':<22}"
        + "".join(f"{m + ' NE':>18}{'gap%':>7}" for m in models)
        + f"{'oracle NE':>11}"
    )
    lines = [head, "-" * len(head)]
    for k in keys:
        o = oracle.get(k, float("nan"))
        row = f"{k:<22}"
        for m in models:
            nes = [r["test"]["metrics"].get(k, {}).get("ne", float("nan")) for r in res[m]]
            ne = float(np.mean(nes))
            gap = (1 - ne) / (1 - o) * 100 if o == o else float("nan")
            row += f"{ms(nes):>18}" + (f"{gap:>7.1f}" if gap == gap else f"{'-':>7}")
        lines.append(row + (f"{o:>11.4f}" if o == o else f"{'-':>11}"))
    lines.append("")
    lines.append(
        "gap% = fraction of the gap to the oracle closed = (1 - NE) / (1 - oracle NE); "
        "'all/*' rows pool surfaces (one base rate); NE = mean ± std over seeds, gap% of the mean"
    )
    lines.append(f"{'model':<8}{'lr':>8}{'seeds':>6}{'MFLOP/ex':>10}{'steps':>7}{'AUC all/click':>20}")
    for m in models:
        r = res[m][-1]
        lr = next((o.split("=")[1] for o in r["overrides"] if o.startswith("train.lr=")), "recipe")
        aucs = [x["test"]["metrics"].get("all/click", {}).get("auc", float("nan")) for x in res[m]]
        lines.append(
            f"{m:<8}{lr:>8}{len(res[m]):>6}{r['flops_per_example'] / 1e6:>10.2f}{r['steps']:>7}{ms(aucs):>20}"
        )
    return "\n".join(lines)


def table_tasks(res: dict[str, list[dict[str, Any]]], metric_keys: list[str]) -> str:
    lines = [
        f"{'model':<8}{'MFLOP/ex':>9}{'n':>3}  "
        + "".join(f"{k + ' ' + w:>27}" for k in metric_keys for w in ("AUC", "NE"))
    ]
    for m, rs in res.items():
        row = f"{m:<8}{rs[0]['flops_per_example'] / 1e6:>9.2f}{len(rs):>3}  "
        for k in metric_keys:
            row += f"{ms([r['test']['metrics'][k]['auc'] for r in rs]):>27}"
            row += f"{ms([r['test']['metrics'][k]['ne'] for r in rs]):>27}"
        lines.append(row)
    return "\n".join(lines)


def table_frappe(res: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        f"{'model':<8}{'MFLOP/ex':>9}{'n':>3}{'test AUC (mean ± std)':>26}{'best epochs':>14}{'BARS':>8}"
    ]
    order = sorted(res, key=lambda m: -np.mean([r["test"]["metrics"]["all/click"]["auc"] for r in res[m]]))
    for m in order:
        rs = res[m]
        lines.append(
            f"{m:<8}{rs[0]['flops_per_example'] / 1e6:>9.3f}{len(rs):>3}"
            f"{ms([r['test']['metrics']['all/click']['auc'] for r in rs]):>26}"
            f"{','.join(str(r['best_epoch']) for r in rs):>14}{BARS_FRAPPE.get(m, float('nan')):>8.4f}"
        )
    bars = sorted(BARS_FRAPPE, key=lambda m: -BARS_FRAPPE[m])
    lines.append(f"ordering here: {' > '.join(order)};  BARS: {' > '.join(bars)}")
    return "\n".join(lines)


def table_throughput(res: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        f"{'model':<8}{'MFLOP/ex':>9}{'steps':>7}{'examples/s':>12}{'peak RSS MB':>13}"
        f"{'load avg (1,5,15 min)':>26}"
    ]
    for m, rs in res.items():
        r = rs[0]
        la = ", ".join(f"{x:.1f}" for x in r["loadavg"])
        lines.append(
            f"{m:<8}{r['flops_per_example'] / 1e6:>9.2f}{r['steps']:>7}{r['examples_per_s']:>12.0f}"
            f"{r['peak_rss_mb']:>13.0f}{la:>26}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bench", choices=list(BENCHES))
    p.add_argument("--out", default=str(REPO / "runs" / "model_quality"))
    p.add_argument("--data", default=None)
    p.add_argument("--models", default=None)
    p.add_argument("--seeds", default=None)
    p.add_argument("--table-only", action="store_true")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (each one process, one thread)")
    p.add_argument("--best-lr-seeds", default=None,
                   help="sim: seeds rerun at each best lr (1-4; 'none' = only the grid's seeds)")
    p.add_argument("--lrs", default=None, help="the lr grid, e.g. 1e-3,3e-3 (default: the benchmark's)")
    p.add_argument("overrides", nargs="*", help="extra section.key=value for every run")
    args = p.parse_args(argv)
    spec = dict(BENCHES[args.bench])
    if args.best_lr_seeds:
        spec["best_lr_seeds"] = ([] if args.best_lr_seeds == "none"
                                 else [int(s) for s in args.best_lr_seeds.split(",")])
    if args.lrs:
        spec["lrs"] = [float(x) for x in args.lrs.split(",")]
    out = Path(args.out)
    models = args.models.split(",") if args.models else spec["models"]
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else spec["seeds"]
    data = ensure_data(args.bench, out, args.data, spec["config"])
    if not args.table_only:
        run_jobs(args.bench, spec, data, out, models, seeds, args.overrides, jobs=args.jobs)
        if spec.get("best_lr_seeds"):
            best, _ = best_lr(out, args.bench, models, seeds, spec["lrs"])
            lrs = {m: _lr_of(r[0]) for m, r in best.items()}
            run_jobs(args.bench, spec, data, out, models, spec["best_lr_seeds"], args.overrides, lrs,
                     args.jobs)
    if spec.get("best_lr_seeds"):
        seeds = sorted(set(seeds) | set(spec["best_lr_seeds"]))
    grid = ""
    if spec.get("lrs"):
        res, grid = best_lr(out, args.bench, models, seeds, spec["lrs"])
    else:
        res = load(out, args.bench, models, seeds)
    if not res:
        print("no results yet")
        return 1
    print(
        f"\n== {args.bench}: {spec['config']} on {data}; train {spec['train']}, test {spec['test']}"
        + (f", early stopping on {spec['valid']}" if spec["valid"] else "")
    )
    if args.bench == "sim":
        print(table_sim(res, data))
        print(grid)
    elif args.bench == "kuairand":
        print(table_tasks(res, ["all/is_click", "all/long_view", "all/is_like"]))
    elif args.bench == "frappe":
        print(table_frappe(res))
    else:
        print(table_throughput(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
