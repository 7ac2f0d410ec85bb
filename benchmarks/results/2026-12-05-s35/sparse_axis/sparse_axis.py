"""The sparse (table) rate tuned on its own axis, after lr_compare.py's coupled grid (session 35).

lr_compare.py scales the dense and the sparse rate together. On frappe_x1 a 2-D grid found every family's best
sparse rate 10-30x the recipe's (`../realdata_frappe/grid2d.py`). Here, per family: the coupled grid's winner
(epoch by validation NE, seed 0, from lr_compare.py's OUT) keeps its dense rate, and its sparse rate is
swept over the recipe's sparse rate x 0.3 / 1 / 3 / 10 / 30 (one more step past whichever edge the best sits
on, up to two), seed 0; the lowest validation NE wins (never test), seeds 1-4 run there; GEM minus each
baseline on test per task, paired by seed. Runs are lr_compare.py's (same harness and flags), one JSON
each, reused.

    python sparse_axis.py DATASET LR_COMPARE_OUT OUT [--models gem,dcnv2,dlrm,wukong,din] [--jobs 2]
"""
import argparse
import importlib.util
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[4]
spec = importlib.util.spec_from_file_location("lr_compare", REPO / "benchmarks" / "lr_compare.py")
lrc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lrc)

FACTORS = [0.3, 1.0, 3.0, 10.0, 30.0]


def path(out: Path, model: str, sparse: float, seed: int) -> Path:
    return out / f"{model}_sp{sparse:g}_seed{seed}.json"


def print_test(runs: dict[str, list[Path]], key: str, label: dict[str, str]) -> None:
    """Test AUC / NE of each model's runs (epoch by validation NE); GEM minus each other, paired by seed."""
    test = {}
    for m, paths in runs.items():
        recs = [lrc.chosen_epoch(json.loads(p.read_text()), "ne") for p in paths]
        test[m] = {k: np.array([h["test"]["metrics"][key][k] for h in recs]) for k in ("auc", "ne")}
        print(f"  {m:<7} {label[m]}: AUC {test[m]['auc'].mean():.4f}  "
              f"NE {test[m]['ne'].mean():.4f} (sd {test[m]['ne'].std(ddof=1):.4f})")
    for m in (m for m in runs if m != "gem"):
        print(f"  gem - {m}: NE {lrc.paired_ci(test['gem']['ne'] - test[m]['ne'])}, "
              f"AUC {lrc.paired_ci(test['gem']['auc'] - test[m]['auc'])}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset", choices=list(lrc.DATASETS))
    ap.add_argument("lrc_out", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--models", default="gem,dcnv2,dlrm,wukong,din")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    ds, models = args.dataset, args.models.split(",")
    base_lr, base_sp = lrc.base_rates(ds)
    data = args.lrc_out / ds
    args.out.mkdir(parents=True, exist_ok=True)
    dense, base_sparse = {}, {}
    for m in models:  # the coupled winner: its dense rate stays; its runs are reused as that sparse point
        scale = lrc.best_scale(args.lrc_out, ds, m, 0, [0.3, 1.0, 3.0], "ne")
        dense[m] = base_lr * scale
        base_sparse[m] = base_sp * scale
        for s in range(5):
            src = lrc.result_path(args.lrc_out, ds, m, s, scale)
            dst = path(args.out, m, float(f"{base_sparse[m]:g}"), s)
            if src.exists() and not dst.exists():
                dst.write_text(src.read_text())

    def run(job: tuple[str, float, int]) -> None:
        m, sparse, seed = job
        res = path(args.out, m, sparse, seed)
        if res.exists():
            return
        cmd = lrc.harness_command(ds, data, res, m, seed, dense[m], sparse, 0, [])
        print("$", " ".join(cmd[2:]), flush=True)
        subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def tried(m: str) -> list[float]:
        return sorted(float(p.name[len(m) + 3:].rsplit("_seed", 1)[0])
                      for p in args.out.glob(f"{m}_sp*_seed0.json"))

    def valid(m: str, sparse: float) -> float:
        return lrc.valid_ne(json.loads(path(args.out, m, sparse, 0).read_text()), "ne")

    def best(m: str) -> float:
        return min(tried(m), key=lambda s: valid(m, s))

    grid = [float(f"{base_sp * f:g}") for f in FACTORS]
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(run, [(m, s, 0) for m in models for s in grid]))
        for _ in range(2):  # past whichever edge the best sits on
            edge = [(m, float(f"{best(m) * (10 / 3 if best(m) == max(tried(m)) else 0.3):.2g}"), 0)
                    for m in models if best(m) in (max(tried(m)), min(tried(m)))]
            list(pool.map(run, edge))
        chosen = {m: best(m) for m in models}
        list(pool.map(run, [(m, chosen[m], s) for m in models for s in range(1, 5)]))
    print(f"{ds}: seed 0 validation NE (epoch by validation NE) per sparse rate, at the coupled winner's "
          "dense rate")
    for m in models:
        print(f"  {m:<7} dense {dense[m]:g}: " + "   ".join(f"s{s:g} {valid(m, s):.4f}" for s in tried(m)))
    for task in lrc.DATASETS[ds]["tasks"]:
        key = f"all/{task}"
        print(f"\ntest {key} at the chosen sparse rate, epoch by validation NE, 5 seeds")
        print_test({m: [path(args.out, m, chosen[m], s) for s in range(5)] for m in models}, key,
                   {m: f"dense {dense[m]:g} sparse {chosen[m]:g}" for m in models})


if __name__ == "__main__":
    main()
