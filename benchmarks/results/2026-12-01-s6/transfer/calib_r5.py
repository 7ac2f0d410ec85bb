"""Calibration round 5 (docs/TRANSFER.md): tuned KD's TR with epochs_per_window tuned per arm.

Usage: python calib_r5.py CONFIG OUT [section.key=value ...]   (OUT holds the seeds' streams and FM versions)

`opengem transfer` trains every arm with one ``epochs_per_window``; round 5 tunes it per arm over the same
set (EPOCHS below) for the baseline and for KD, which the experiment's config cannot express. This script
therefore drives the experiment's own pieces in the experiment's order: ``SeedRun`` (stream, FM versions,
side tables), ``SeedRun.run_lag`` for the baseline and the KD grid at each E on the first seed, picks on
that seed's validation windows (baseline: E; KD: E x kd.grid; lowest NE averaged over surfaces, ties to
fewer epochs, the rule ``arms.tune_kd`` applied then,
``tuning.choose`` now), runs the other seeds at the picked points, and reports
``aggregate.calibration_table`` (TR with its paired bootstrap CI over rows, pooled and per seed) on the
validation windows only. The evaluation window is predicted by every VM (``run_arm`` predicts all windows
after the first) but read by nothing here. Writes OUT/calib_r5.json.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from opengem.model.flops import model_flops
from opengem.model.registry import build_model
from opengem.train.distributed import process_group
from opengem.train.env import cpu_threads, resolve_device
from opengem.transfer.aggregate import calibration_table, select_rows
from opengem.transfer.arms import arm_configs
from opengem.transfer.experiment import _jsonable, calibration_text, validation_ids
from opengem.transfer.experiment_config import load_experiment_config
from opengem.transfer.preds import sigmoid
from opengem.transfer.results import ne_of
from opengem.transfer.seed_run import SeedRun
from opengem.transfer.tuning import kd_grid_ne
from opengem.transfer.vm_train import ArmConfig

# the same set for every arm (R5_EPOCHS=1,2 only to smoke-test the script on fewer runs)
EPOCHS = tuple(int(e) for e in os.environ.get("R5_EPOCHS", "1,2,4").split(","))


def mean_ne(seed_res: dict[str, Any], pick: Any) -> float:
    """NE of one arm's predictions (``pick(surface_result)``) averaged over surfaces x tasks."""
    nes = []
    for r in seed_res.values():
        run = pick(r)
        for t in range(len(r["tasks"])):
            m = run["mask"][:, t]
            if m.any() and 0 < run["labels"][m, t].mean() < 1:
                nes.append(ne_of(sigmoid(run["logits"][m, t]), run["labels"][m, t].astype(np.float64)))
    return float(np.mean(nes)) if nes else float("nan")


def compose(base_res: dict[str, Any], kd_res: dict[str, Any], kd_pick: Any) -> dict[str, Any]:
    """One seed's result with the baseline of one run and KD of another (same rows, same FM)."""
    return {s: {"surface": r["surface"], "tasks": r["tasks"], "baseline": r["baseline"],
                "kd": kd_pick(kd_res[s]), "fm": kd_res[s]["fm"]} for s, r in base_res.items()}


def main() -> None:
    config, out, overrides = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    cfg = load_experiment_config(config, overrides)
    if not cfg.validation_windows:
        raise SystemExit(f"{config}: validation_windows = 0; round 5 picks on validation windows only")
    dev = resolve_device(cfg.train.device)
    t0, c0 = time.perf_counter(), time.process_time()

    def log(msg: str) -> None:
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(f"[{wall:7.0f}s wall {cpu:7.0f}s cpu] {msg}", flush=True)

    with process_group(dev) as pg, cpu_threads(cfg.threads):
        runs = [SeedRun(cfg, s, out, dev, pg, log) for s in cfg.seeds]
        val_ids = [validation_ids(r) for r in runs]
        log(f"FM versions {[v.version for v in runs[0].versions]}; VM windows {runs[0].windows}; "
            f"validation {runs[0].eval_windows[:cfg.validation_windows]}")
        base_arm = {"baseline": ArmConfig()}
        first: dict[int, dict[str, Any]] = {}
        table = []  # seed-0 validation NE of the baseline and every KD grid point at every E
        for e in EPOCHS:
            cfg.epochs_per_window = e
            first[e] = runs[0].run_lag(cfg.lag, ["baseline"], base_arm, kd_results=None)
            val = select_rows(first[e], val_ids[0])
            row = {"epochs": e, "baseline_ne": mean_ne(val, lambda r: r["baseline"]),
                   "baseline_ne_per_surface": {s: mean_ne({s: r}, lambda x: x["baseline"])
                                               for s, r in val.items()},
                   "kd_grid_ne": kd_grid_ne(val, cfg.kd.grid)}
            table.append(row)
            log(f"seed {cfg.seeds[0]} E={e}: baseline val NE {row['baseline_ne']:.4f}; KD grid "
                + " ".join(f"{p['point']}:{p['ne']:.4f}" for p in row["kd_grid_ne"]))
        e_base = min(table, key=lambda r: (r["baseline_ne"], r["epochs"]))["epochs"]
        kd_cands = [(p["ne"], r["epochs"], p["point"]) for r in table for p in r["kd_grid_ne"]
                    if np.isfinite(p["ne"])]
        _, e_kd, kd_point = min(kd_cands, key=lambda c: (c[0], c[1]))
        kd_arm = arm_configs(cfg, kd_point, {"kd": e_kd})["kd"]  # the arm carries its E (as when it ran)
        log(f"tuned: baseline E={e_base}; KD E={e_kd} weight={kd_point[0]} temperature={kd_point[1]}")
        per_seed = [compose(first[e_base], first[e_kd], lambda r: r["kd_grid"][tuple(kd_point)])]
        same_e = [compose(first[e_kd], first[e_kd], lambda r: r["kd_grid"][tuple(kd_point)])]
        for r in runs[1:]:
            cfg.epochs_per_window = e_base
            b = r.run_lag(cfg.lag, ["baseline"], base_arm, kd_results={})
            cfg.epochs_per_window = e_kd
            k = r.run_lag(cfg.lag, ["kd"], {"kd": kd_arm}, kd_results={})
            per_seed.append(compose(b, k, lambda x: x["kd"]))
            log(f"seed {r.seed} done")
        calib = calibration_table([select_rows(res, v) for res, v in zip(per_seed, val_ids)], cfg)
        sch = runs[0].schema
        fm_flops = model_flops(build_model(sch, cfg.fm.model))
        vm_flops = {s: int(r["baseline"]["serving_flops"]) for s, r in per_seed[0].items()}
    result = {
        "config": config, "overrides": overrides, "epochs_grid": list(EPOCHS),
        "tuned": {"baseline_epochs": e_base, "kd_epochs": e_kd, "kd_weight": kd_point[0],
                  "kd_temperature": kd_point[1]},
        "seed0_validation_table": table,
        "calibration": calib,
        "fm_flops_per_example": fm_flops, "vm_flops_per_example": vm_flops,
        "fm_over_vm_flops": {s: fm_flops / v for s, v in vm_flops.items()},
        "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
    }
    if e_base != e_kd:  # what TR would be with the baseline at KD's E (same training length), for reading
        result["calibration_same_epochs"] = calibration_table(
            [select_rows(same_e[0], val_ids[0])], dataclasses.replace(cfg, seeds=cfg.seeds[:1]))
    (out / "calib_r5.json").write_text(json.dumps(_jsonable(result), indent=2))
    print("\ncalibration (validation windows, per-arm E): tuned KD's TR per VM surface x task")
    print(calibration_text(calib))
    if "calibration_same_epochs" in result:
        print(f"\nseed {cfg.seeds[0]} only, baseline at KD's E={e_kd}:")
        print(calibration_text(result["calibration_same_epochs"]))
    print(f"\nserving FLOPs/example: FM {fm_flops:,}; VM {vm_flops} "
          f"(FM/VM {min(result['fm_over_vm_flops'].values()):.1f}x)")
    log(f"wrote {out / 'calib_r5.json'}")


if __name__ == "__main__":
    main()
