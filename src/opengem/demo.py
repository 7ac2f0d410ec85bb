"""``make demo``: simulate -> train GEM -> train DLRM on the same data -> evaluate both -> one table.

Runs in a few minutes on a 2-core CPU with configs/small.toml and leaves everything under runs/demo/
(data/, gem/, dlrm/ with eval.json each), so a newcomer can open the run folders, TensorBoard logs and
checkpoints afterwards. ``--config configs/tiny.toml`` is the seconds-long smoke test.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def default_config() -> Path:
    for p in (REPO / "configs" / "small.toml", Path("configs/small.toml")):
        if p.exists():
            return p
    raise FileNotFoundError("configs/small.toml not found: run from the repository root or pass --config")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m opengem.demo", description=__doc__.splitlines()[0])
    p.add_argument("--config", default=None, help="recipe (default: configs/small.toml)")
    p.add_argument("--out", default="runs/demo", help="output folder (default: runs/demo)")
    p.add_argument("--baseline", default="dlrm", help="baseline model name (dlrm, dcnv2, din, wukong)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="applied to both runs")
    args = p.parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)  # TorchRec/DCP deprecation notices

    from opengem.train.config import load_run_config
    from opengem.train.data import prepare_data
    from opengem.train.evaluate import evaluate_run, format_metrics
    from opengem.train.trainer import train

    config = Path(args.config) if args.config else default_config()
    cfg = load_run_config(config, args.overrides)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    data = prepare_data(cfg.data, out, None)
    timings["data"] = time.perf_counter() - t0
    print(f"[demo] data: {data} ({timings['data']:.1f}s)", flush=True)

    results = {}
    for name in ("gem", args.baseline):
        run_cfg = copy.deepcopy(cfg)
        run_cfg.model.name = name
        run_cfg.train.final_eval = False  # evaluate_run below does it once, with the oracle
        t0 = time.perf_counter()
        summary = train(run_cfg, out / name, data, force=True)  # a rerun replaces the last demo
        timings[f"train {name}"] = time.perf_counter() - t0
        flops = summary["flops_per_example"]
        print(f"[demo] trained {name}: {summary['steps']} steps, {summary['examples_per_s']:,.0f} ex/s, "
              f"loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}, "
              f"{(flops or 0) / 1e6:.2f} MFLOP/example ({timings[f'train {name}']:.1f}s)", flush=True)
        t0 = time.perf_counter()
        results[name] = evaluate_run(out / name, data)
        timings[f"eval {name}"] = time.perf_counter() - t0

    oracle = results["gem"].get("oracle")
    print()
    print(f"NE (lower is better; 1.0 = predicting the base rate) and AUC on {results['gem']['partitions']}")
    print(format_metrics(results, oracle))
    print()
    print("NE base rate: " + results["gem"]["ne_base_rate"])
    print("time: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items())
          + f", total {sum(timings.values()):.1f}s")
    print(f"runs: {out}/gem, {out}/{args.baseline} (eval.json, metrics.jsonl, tb/, checkpoints/)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
