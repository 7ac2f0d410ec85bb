"""``train.pipeline``: the plain loop vs TorchRec's TrainPipelineSparseDist, A/B in interleaved runs.

Each run is ``opengem train`` (under ``torchrun --standalone`` when ``--nproc`` > 1) on the same data,
``--steps`` steps, no evaluation or checkpoint in between; its steady rate is the global batch times the
steps after the first over the time in those steps (train_summary.json: startup.train_seconds). Runs
alternate none / sparse_dist ``--repeats`` times so machine load hits both alike; the load average is
recorded before each run. Prints a table and writes ``OUT/pipeline_ab.json``.

    .venv/bin/python benchmarks/pipeline_ab.py --config configs/small-d32.toml --models dcnv2,gem \
        --nproc 2 --steps 60 --repeats 3 --out runs/bench/pipeline
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODES = ("none", "sparse_dist")


def run(args: argparse.Namespace, model: str, mode: str, data: Path, out: Path) -> dict[str, Any]:
    overrides = ["train.progress=false", f"train.threads={args.threads}", f"model.name={model}",
                 f"train.steps={args.steps}", "train.eval_every=0", "train.final_eval=false",
                 "train.checkpoint_every=0", f"train.log_every={args.steps}", f"train.pipeline={mode}",
                 f"data.batch_size={args.batch_size}", *args.overrides]
    train = ["-m", "opengem.cli", "train", "--config", args.config, "--data", str(data), "--out", str(out),
             "--force", *overrides]
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            str(args.nproc), *train] if args.nproc > 1 else [sys.executable, *train])
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONWARNINGS": "ignore"}
    load = os.getloadavg()[0]
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    failed = []
    if r.returncode:  # recorded, and the run repeated once; a second failure ends the benchmark
        failed.append(r.returncode)
        print(f"{model} {mode}: exit {r.returncode}, repeating once; stderr tail:\n{r.stderr[-1500:]}",
              file=sys.stderr, flush=True)
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"{model} {mode}: exit {r.returncode} twice\n{r.stderr[-3000:]}")
    s = json.loads((out / "train_summary.json").read_text())
    steady_s = s["startup"]["train_seconds"]
    per_step = s["examples"] / s["steps"]
    return {"examples_per_s": per_step * (s["steps"] - 1) / steady_s, "first_step_s":
            s["startup"]["phases"].get("first_step", float("nan")), "load_before": load,
            "wall_s": time.perf_counter() - t, "world_size": s["world_size"], "failed_exit_codes": failed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/small-d32.toml")
    ap.add_argument("--models", default="dcnv2,gem")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=512, help="rows per rank per step")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data", default="", help="an existing dataset (default: simulate the config's once)")
    ap.add_argument("--out", required=True)
    ap.add_argument("overrides", nargs="*", help="key=value config overrides for every run")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.data:
        data = Path(args.data)
    else:
        from opengem.train.config import load_run_config
        from opengem.train.data import prepare_data
        data = prepare_data(load_run_config(args.config, args.overrides).data, out / "data")
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for rep in range(args.repeats):
        for model in args.models.split(","):
            for mode in (MODES if rep % 2 == 0 else MODES[::-1]):
                res = run(args, model, mode, data, out / "runs" / f"{model}-{mode}")
                results.setdefault(model, {}).setdefault(mode, []).append(res)
                print(f"repeat {rep} {model:6s} {mode:11s} {res['examples_per_s']:9,.0f} ex/s "
                      f"(load {res['load_before']:.2f})", flush=True)
    rows = []
    for model, modes in results.items():
        med = {m: statistics.median(r["examples_per_s"] for r in runs) for m, runs in modes.items()}
        ratios = [b["examples_per_s"] / a["examples_per_s"]
                  for a, b in zip(modes["none"], modes["sparse_dist"])]
        rows.append({"model": model, "none": med["none"], "sparse_dist": med["sparse_dist"],
                     "ratio_median": statistics.median(ratios), "ratios": ratios})
    print(f"\n{args.nproc} process(es) x {args.threads} thread(s), batch {args.batch_size}/rank, "
          f"{args.steps} steps, {args.repeats} repeats; median steady examples/s (global)")
    print("| model | pipeline none | sparse_dist | sparse_dist / none (median of pairs) | pairs |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['none']:,.0f} | {r['sparse_dist']:,.0f} | {r['ratio_median']:.3f}x | "
              + ", ".join(f"{x:.3f}" for x in r["ratios"]) + " |")
    (out / "pipeline_ab.json").write_text(json.dumps({"args": vars(args), "rows": rows, "runs": results},
                                                     indent=2))


if __name__ == "__main__":
    main()
