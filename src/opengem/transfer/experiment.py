"""``opengem transfer --config C.toml``: the FM -> VM transfer experiment, all arms on one stream.

Per seed: one simulated stream (or a real dataset cut into day windows); FM versions trained on growing
window sets (``versions.py``); knowledge generated once per example for every staleness level
(``generate.py``); then per VM surface the arms, each trained progressively from window ``vm_start``
(= 1 + the largest lag, so every arm and lag has the same budget: same windows, steps, model) and
evaluated on every later window before training on it:

- baseline: labels only;
- kd: standard KD on the serving head, tuned over ``kd_grid`` (weight, temperature[, mse weight]) on the
  validation windows of the first ``tune_seeds`` seeds (``tuning.py``: with ``tune_epochs`` over epochs x
  grid, and every other arm's epochs over the same set; with ``tune_per_surface`` per VM surface); the
  tuned point is the reference of R;
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
versions, side tables, arms per lag), ``arms.py`` (arm switches), ``tuning.py`` (KD's point and each
arm's epochs, shared or per surface, on validation rows), ``hierarchical.py``, ``aggregate.py`` (per-key
numbers over seeds), ``results.py`` (ratios, CIs, tables, plot); this module only
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
import pyarrow.parquet as pq

from opengem.data.commit import atomic_write_text
from opengem.errors import UsageError
from opengem.train.distributed import process_group
from opengem.train.env import cpu_threads, resolve_device
from opengem.train.run_dir import RUN_FILE, check_run_folder, holds_run
from opengem.transfer.aggregate import aggregate, calibration_table, select_rows
from opengem.transfer.experiment_config import ALL_ARMS, ExperimentConfig, load_experiment_config
from opengem.transfer.results import arms_table, fmt, staleness_plot, staleness_table
from opengem.transfer.seed_run import SeedRun
from opengem.transfer.tuning import tune_on_validation
from opengem.transfer.windows import version_for_window

# after Ctrl-C (opengem.cli): a re-run into the same --out continues the interrupted training from its
# checkpoint and reuses every published version and finished step before it
INTERRUPTED_ADVICE = "run the same command again to continue (it resumes from there)"


def check_transfer_folder(out: Path) -> None:
    """An --out is a new folder or an earlier transfer's (re-runs reuse its work): a run folder or a dataset
    is refused before anything is written into it (seed folders and transfer.json were added to either)."""
    check_run_folder(out)
    if holds_run(out) or (out / RUN_FILE).exists():
        raise UsageError(f"{out}: this is a training run's folder, not a transfer experiment's; choose "
                         "another --out")


def keep_earlier_result(path: Path, config: dict[str, Any]) -> Path | None:
    """Move an earlier ``transfer.json`` of another config aside (``transfer-<UTC time>.json``) before the
    new one replaces it, and return where: a re-run into the same --out reuses the earlier work, and its
    results, e.g. of other arms, were overwritten without a word. The same config's are simply replaced."""
    if not path.exists():
        return None
    try:
        same = json.loads(path.read_text()).get("config") == json.loads(json.dumps(_jsonable(config)))
    except (OSError, ValueError, AttributeError):
        same = False
    if same:
        return None
    stem = f"transfer-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    dest, n = path.with_name(f"{stem}.json"), 1
    while dest.exists():
        n += 1
        dest = path.with_name(f"{stem}.{n}.json")
    path.rename(dest)
    return dest


def run_experiment(cfg: ExperimentConfig, out: str | Path, log: Any = print) -> dict[str, Any]:
    warnings.filterwarnings("ignore", category=FutureWarning)
    cfg.validate()
    out = Path(out)
    check_transfer_folder(out)
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
        val_ids = [validation_ids(r) for r in runs]
        if cfg.validation_windows:
            log(f"validation windows {val_windows(runs[0])}: KD tuned and regime calibrated there; "
                "the arms table reports the windows after them")
        # 1) default lag: tune KD (and, with tune_epochs, every arm's epochs; per surface with
        # tune_per_surface) on the validation windows of the first tune_seeds seeds when there are any,
        # then every arm on every seed with its surface's choices
        tuned = tune_on_validation(runs, val_ids, arms, log)
        acfg = tuned.arm_cfgs(cfg)
        per_seed_all = []
        for i, r in enumerate(runs):
            res = r.run_lag(cfg.lag, arms, None, kd_results={}, surface_arm_cfgs=acfg)
            per_seed_all.append(res)
            log(f"seed {cfg.seeds[i]}: arms done ({time.perf_counter() - t0:.0f}s)")
        per_seed = reported_rows(per_seed_all, val_ids, cfg)
        main = aggregate(per_seed, arms, cfg)
        # tuned KD's TR on the validation windows (a baseline-only run, e.g. a bigger VM for the Pareto
        # comparison, has no KD arm and nothing to calibrate)
        calib = (calibration_table([select_rows(res, v) for res, v in zip(per_seed_all, val_ids)], cfg)
                 if cfg.validation_windows and "kd" in arms else {})
        regime = regime_facts(runs[0], cfg, per_seed[0])
        # 2) staleness sweep: the sweep arms at every lag (the baseline is lag-free: reuse it)
        sweep: dict[str, Any] = {}
        sweep_arms = [a for a in cfg.sweep_arms if a in arms and a not in ("baseline",)]
        for lag in cfg.staleness:
            if lag == cfg.lag:
                lag_seed = per_seed
            else:
                lag_seed = []
                for i, r in enumerate(runs):
                    res = r.run_lag(lag, [a for a in sweep_arms if a != "baseline"], None, kd_results={},
                                    surface_arm_cfgs=acfg)
                    for sname in res:
                        res[sname]["baseline"] = per_seed_all[i][sname]["baseline"]
                    lag_seed.append(res)
                lag_seed = reported_rows(lag_seed, val_ids, cfg)
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
        "kd_tuned": {"per_surface": cfg.tune_per_surface, "tune_seeds": cfg.tune_seeds,
                     "tuned_on_seeds": cfg.seeds[: cfg.tune_seeds], **tuned.record()},
        "epochs_per_window": {
            "tuned_over": cfg.tune_epochs, "per_surface": cfg.tune_per_surface,
            "tuned_on_seeds": cfg.seeds[: cfg.tune_seeds], "chosen": tuned.epochs,
            "validation_ne": tuned.epoch_scores,
            # the first seed's VM optimizer steps per arm and surface: epochs x batches, over its windows
            "steps": {a: {s: per_seed_all[0][s][a].get("steps") for s in per_seed_all[0]} for a in arms},
        },
        "windows": {"vm": runs[0].windows, "vm_per_surface": runs[0].surface_windows,
                    "eval": runs[0].eval_windows[cfg.validation_windows:],
                    "validation": val_windows(runs[0])},
        "calibration": calib,
        "regime": regime,
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
    kept = keep_earlier_result(out / "transfer.json", result["config"])
    if kept is not None:
        log(f"an earlier experiment of another config here: its results moved to {kept}")
    atomic_write_text(out / "transfer.json", json.dumps(_jsonable(result), indent=2))
    if sweep:
        staleness_plot(sweep, str(out / "staleness.png"))
    if calib:
        log("\ncalibration (validation windows): tuned KD's TR per VM surface x task\n"
            + calibration_text(calib))
    log(regime_text(regime))
    log(arms_table(result, arms))
    if sweep:
        log("\nstaleness sweep (transfer ratio)\n" + staleness_table(sweep))
    log(f"\nwrote {out / 'transfer.json'} ({result['seconds']:.0f}s)")
    return result


def val_windows(run: SeedRun) -> list[str]:
    return run.eval_windows[: run.cfg.validation_windows]


def validation_ids(run: SeedRun) -> np.ndarray:
    """Example ids of a seed's validation windows (empty when there are none)."""
    col = run.schema.example_id_column
    files = [f for w in val_windows(run) for f in run.ds.files(w)]
    if not files:
        return np.zeros(0, np.int64)
    return np.concatenate([pq.read_table(f, columns=[col]).column(0).to_numpy() for f in files])


def reported_rows(per_seed: list[dict[str, Any]], val_ids: list[np.ndarray],
                  cfg: ExperimentConfig) -> list[dict[str, Any]]:
    """Per-seed results without the validation windows' rows (all rows when there are none)."""
    if not cfg.validation_windows:
        return per_seed
    out = []
    for res, v in zip(per_seed, val_ids):
        ids = np.concatenate([a["example_id"] for r in res.values() for a in r.values()
                              if isinstance(a, dict) and "example_id" in a])
        out.append(select_rows(res, np.setdiff1d(ids, v)))
    return out


def regime_facts(run: SeedRun, cfg: ExperimentConfig, seed_res: dict[str, Any]) -> dict[str, Any]:
    """What makes the regime production-like, measured on the first seed: FM vs VM training rows at every
    reported window (at the default lag), and FM vs VM serving FLOPs/example."""
    from opengem.model.flops import model_flops
    from opengem.model.registry import build_model

    sch = run.schema
    rows = {}  # window -> rows per surface
    for w in run.parts:
        s = np.concatenate([pq.read_table(f, columns=[sch.surface_column]).column(0).to_numpy()
                            for f in run.ds.files(w)])
        rows[w] = np.bincount(s, minlength=len(sch.surfaces))
    idx = {w: i for i, w in enumerate(run.parts)}
    fm_flops = model_flops(build_model(sch, cfg.fm.model))  # analytic: the config's, not a loaded version's
    out: dict[str, Any] = {"publish_every": cfg.publish_every, "lag": cfg.lag, "vm_start": run.vm_start,
                           "fm_flops_per_example": fm_flops, "surfaces": {}}
    for sname, r in seed_res.items():
        s = sch.surfaces.index(sname)
        per_w = []
        for w in run.eval_windows[cfg.validation_windows:]:
            v = version_for_window(idx[w], cfg.publish_every, cfg.lag)
            fm_rows = int(sum(rows[p].sum() for p in run.parts[:v]))
            vm_rows = int(sum(rows[p][s] for p in run.parts[idx[run.windows_for(s)[0]]: idx[w]]))
            per_w.append({"window": w, "fm_version": v, "fm_rows": fm_rows, "vm_rows": vm_rows,
                          "fm_over_vm_rows": fm_rows / max(vm_rows, 1)})
        vm_flops = int(r["baseline"]["serving_flops"])
        out["surfaces"][sname] = {
            "windows": per_w, "min_fm_over_vm_rows": min(p["fm_over_vm_rows"] for p in per_w),
            "history_windows": cfg.history_windows(sname)[0],
            "vm_flops_per_example": vm_flops, "fm_over_vm_flops": fm_flops / max(vm_flops, 1)}
    return out


def calibration_text(calib: dict[str, Any]) -> str:
    """Pooled over seeds, then one line per seed ("seed i") when there are several: the band must hold on
    every calibration seed. ``TR 95% CI``: paired bootstrap over the validation rows."""
    lines = [f"{'surface/task':<22}{'rows':>8}{'base NE':>9}{'KD NE':>9}{'FM NE':>9}{'KD TR':>8}"
             f"{'in band':>9}  TR 95% CI"]

    def line(name: str, m: dict[str, Any]) -> str:
        tr = m["kd_tr"]
        ok = "yes" if tr is not None and 0.15 <= tr <= 0.5 else "no"
        return (f"{name:<22}{m['rows']:>8}{fmt(m['baseline_ne']):>9}{fmt(m['kd_ne']):>9}{fmt(m['fm_ne']):>9}"
                f"{fmt(tr, 2):>8}{ok:>9}  {fmt(m.get('kd_tr_ci'))}")

    for k, m in calib.items():
        lines.append(line(k, m))
        for ps in m.get("per_seed") or []:
            if ps is not None:
                lines.append(line(f"  seed {ps['seed']}", ps))
    return "\n".join(lines)


def regime_text(regime: dict[str, Any]) -> str:
    lines = [f"\nregime: FM versions every {regime['publish_every']} windows, lag {regime['lag']}, VM from "
             f"window {regime['vm_start']}, FM {regime['fm_flops_per_example']:,} FLOPs/example"]
    for sname, m in regime["surfaces"].items():
        history = f", {m['history_windows']} history windows" if m.get("history_windows") else ""
        lines.append(f"  {sname}: FM/VM training rows >= {m['min_fm_over_vm_rows']:.1f}x, FM/VM serving "
                     f"FLOPs {m['fm_over_vm_flops']:.1f}x (VM {m['vm_flops_per_example']:,}){history}")
    return "\n".join(lines)


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
