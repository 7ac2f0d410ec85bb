"""``opengem transfer --config C.toml``: the FM -> VM transfer experiment, all arms on one stream.

Per seed: one simulated stream (or a real dataset cut into day windows); FM versions trained on growing
window sets (``versions.py``); knowledge generated once per example for every staleness level
(``generate.py``); then per VM surface the arms, each trained progressively from window ``vm_start``
(= 1 + the largest lag, so every arm and lag has the same budget: same windows, steps, model) and
evaluated on every later window before training on it:

- baseline: labels only;
- kd: standard KD on the serving head, tuned over ``kd_grid`` (weight, temperature[, mse weight]);
  the best grid point by pooled NE is the reference of R (picked on the evaluation rows, which favours
  KD: R is conservative);
- aux_head: tuned KD through the auxiliary head (serving head labels only) with gradient/label scaling;
- student_adapter: + distil from the Student Adapter refit on each window's labels;
- fm_embeddings: + FM user/ad embeddings (per-version standardised) as VM features;
- param_sharing: + FM embedding-layer components shared into the VM (``share`` mode), and the FM's
  sequence encoder path (``sharing.sequence_encoder``, frozen or low-lr; its serving FLOPs are counted);
- hierarchical: FM -> domain FM (the VM surface's group, aux-head KD + adapter from the FM) -> VM
  (aux-head KD from the domain FM's fresh predictions).

Surface bias: ``surface_bias[s]`` is added to the FM's logits on surface s (a controlled FM
miscalibration, see knowledge.py). Output: OUT/transfer.json, OUT/staleness.png, tables on stdout.

By job: ``experiment_config.py`` (the TOML), ``windows.py`` (the stream), ``seed_run.py`` (one seed: FM
versions, side tables, arms per lag), ``arms.py`` (arm switches, KD tuning), ``hierarchical.py``,
``aggregate.py`` (per-key numbers over seeds), ``results.py`` (ratios, CIs, tables, plot); this module only
runs them in order and writes the result.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from opengem.train.distributed import process_group
from opengem.train.env import cpu_threads, resolve_device
from opengem.transfer.aggregate import aggregate
from opengem.transfer.arms import arm_configs, tune_kd
from opengem.transfer.experiment_config import ALL_ARMS, ExperimentConfig, load_experiment_config
from opengem.transfer.results import arms_table, staleness_plot, staleness_table
from opengem.transfer.seed_run import SeedRun


def run_experiment(cfg: ExperimentConfig, out: str | Path, log: Any = print) -> dict[str, Any]:
    warnings.filterwarnings("ignore", category=FutureWarning)
    cfg.validate()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dev = resolve_device(cfg.train.device)  # every VM of the experiment trains here
    arms = [a for a in ALL_ARMS if a in cfg.arms]
    t0 = time.perf_counter()
    with process_group(dev) as pg, cpu_threads(cfg.threads):
        runs = [SeedRun(cfg, s, out, dev, pg, log) for s in cfg.seeds]
        log(
            f"FM versions ready ({len(runs[0].versions)} per seed); VM windows {runs[0].windows}, "
            f"eval {runs[0].eval_windows}"
        )
        # 1) default lag: tune KD on the first seed, then every arm on every seed
        first = runs[0].run_lag(cfg.lag, [], None)
        kd_best = tune_kd(first, cfg.kd.grid)
        acfg = arm_configs(cfg, kd_best)
        log(f"tuned KD: weight={kd_best[0]} temperature={kd_best[1]}")
        per_seed = []
        for i, r in enumerate(runs):
            res = r.run_lag(cfg.lag, arms, acfg, kd_results={})
            per_seed.append(res)
            log(f"seed {cfg.seeds[i]}: arms done ({time.perf_counter() - t0:.0f}s)")
        main = aggregate(per_seed, arms, cfg)
        # 2) staleness sweep: the sweep arms at every lag (the baseline is lag-free: reuse it)
        sweep: dict[str, Any] = {}
        sweep_arms = [a for a in cfg.sweep_arms if a in arms and a not in ("baseline",)]
        for lag in cfg.staleness:
            if lag == cfg.lag:
                lag_seed = per_seed
            else:
                lag_seed = []
                for i, r in enumerate(runs):
                    res = r.run_lag(lag, [a for a in sweep_arms if a != "baseline"], acfg, kd_results={})
                    for sname in res:
                        res[sname]["baseline"] = per_seed[i][sname]["baseline"]
                    lag_seed.append(res)
            agg = aggregate(lag_seed, ["baseline", *[a for a in sweep_arms if a != "baseline"]], cfg)
            sweep[str(lag)] = {
                a: {k: {"tr": m["tr"], "ne": m["ne"], "r": m["r"]} for k, m in agg["arms"][a].items()}
                for a in agg["arms"]
                if a != "baseline"
            }
            log(f"staleness lag {lag} done ({time.perf_counter() - t0:.0f}s)")
    flops = {}
    for a in arms:
        for sname in per_seed[0]:
            r = per_seed[0][sname][a]
            flops[a] = {
                "serving_flops_per_example": int(r["serving_flops"]),
                "shared_fm_params": int(r.get("shared_params", 0)),
            }
            if a == "hierarchical":
                flops[a]["domain_fm_flops_per_example"] = int(r["domain_flops"])
    gen = [g for r in runs for g in r.gen.values()]
    result = {
        "config": asdict(cfg),
        "kd_tuned": {"weight": kd_best[0], "temperature": kd_best[1]},
        "windows": {"vm": runs[0].windows, "eval": runs[0].eval_windows},
        "soft_labels": "per task, the FM head of the example's own surface",
        "arms": main["arms"],
        "fm": main["fm"],
        "hierarchical": main["hierarchical"],
        "staleness": sweep,
        "serving_flops": flops,
        "adapter_mean_abs_correction": {
            s: per_seed[0][s].get("student_adapter", {}).get("adapter_mean_abs_correction")
            for s in per_seed[0]
        },
        "generation": {
            "examples_per_s": float(np.mean([g["examples_per_s"] for g in gen])) if gen else None,
            "forward_examples_per_s": float(np.mean([g["forward_examples_per_s"] for g in gen]))
            if gen
            else None,
            "rows": int(sum(g["rows"] for g in gen)),
        },
        "fm_train_seconds": [r.fm_train_s for r in runs],
        "seconds": time.perf_counter() - t0,
    }
    (out / "transfer.json").write_text(json.dumps(_jsonable(result), indent=2))
    if sweep:
        staleness_plot(sweep, str(out / "staleness.png"))
    log(arms_table(result, arms))
    if sweep:
        log("\nstaleness sweep (transfer ratio)\n" + staleness_table(sweep))
    log(f"\nwrote {out / 'transfer.json'} ({result['seconds']:.0f}s)")
    return result


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return None if not np.isfinite(x) else float(x)
    if isinstance(x, np.integer):
        return int(x)
    return x


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="experiment TOML (configs/transfer*.toml)")
    p.add_argument("--out", default="runs/transfer", help="output folder (transfer.json, staleness.png)")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides")


def run(args: argparse.Namespace) -> int:
    cfg = load_experiment_config(args.config, args.overrides)
    run_experiment(cfg, args.out)
    return 0
