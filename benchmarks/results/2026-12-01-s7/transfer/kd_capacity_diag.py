"""Round 7 (a), docs/TRANSFER.md: can the feed VM represent what the FM knows about feed? Chooses nothing.

Round 6 measured that no KD point at any length moves seed 100's feed VM by more than 0.008 NE while the
FM leads by 0.15-0.20 NE. Either the VM cannot represent the FM's feed predictions (its inputs or size),
or it can but its 1-2 days of rows do not show it enough. This script separates the two with the
experiment's own pieces (``SeedRun``, the KD arm, ``ProgressiveStudent``): the VM as configured, trained
progressively (predict a window, then train on it) on the FM's soft labels only -- the KD arm at weight
1000, T 1, so the label term weighs 1/1000 of the KD term (AdamW and row-wise Adagrad are scale-invariant:
pure distillation up to 0.1 %) -- at E = 1, 2, 4 over the VM windows, and at E = 1 over every window of its
surface from the first one with a published FM version (3x the rows). Per surface it reports, on the
validation days and on the VM's last two trained windows (12-13, after training through 13): NE, and the
VM's fit to the FM's logits (MSE, Pearson r), beside the labels-only baseline's (E = 1) and the FM's NE.
The evaluation window is never built, trained on or predicted.

Usage: python kd_capacity_diag.py CONFIG OUT_JSON SEED_ROOT [key=value ...]
(SEED_ROOT holds seed<seed>/data and seed<seed>/fm; the FM versions are reused, not retrained.)
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from opengem.train.distributed import process_group
from opengem.train.env import cpu_threads, resolve_device
from opengem.transfer.experiment import val_windows
from opengem.transfer.experiment_config import load_experiment_config
from opengem.transfer.generate import generate, read_side_table
from opengem.transfer.knowledge import KnowledgeTable
from opengem.transfer.preds import concat_preds, sigmoid
from opengem.transfer.results import ne_of
from opengem.transfer.seed_run import SeedRun
from opengem.transfer.vertical import build_vm_dataset, derive_vm_schema
from opengem.transfer.vm_train import ArmConfig
from opengem.transfer.windows import version_for_window

PURE_KD_WEIGHT = 1000.0  # label BCE : KD BCE = 1 : 1000
EPOCHS = (1, 2, 4)


def measure(preds: dict[str, np.ndarray], know: KnowledgeTable) -> dict[str, Any]:
    """NE of the VM and of the FM on the same rows (click task, FM available), and the VM's logit fit to
    the FM's: MSE and Pearson r."""
    fm, ok = know.lookup(preds["example_id"], preds["surface"], use_adapter=False)
    keep = preds["mask"][:, 0] & ok[:, 0]
    vm_l, fm_l = preds["logits"][keep, 0].astype(np.float64), fm[keep, 0].astype(np.float64)
    y = preds["labels"][keep, 0].astype(np.float64)
    return {
        "rows": int(keep.sum()),
        "vm_ne": ne_of(sigmoid(vm_l), y),
        "fm_ne": ne_of(sigmoid(fm_l), y),
        "logit_mse": float(np.mean((vm_l - fm_l) ** 2)),
        "logit_r": float(np.corrcoef(vm_l, fm_l)[0, 1]),
        "fm_logit_var": float(np.var(fm_l)),
    }


def progressive(
    run: SeedRun,
    arm: ArmConfig,
    schema: Any,
    vm_dir: Path,
    know: KnowledgeTable,
    windows: list[str],
    val: list[str],
    fit_on: list[str],
) -> dict[str, Any]:
    """Train over ``windows`` (predicting each of ``val`` before training on it; the last window is only
    predicted), then predict ``fit_on`` (windows trained on) with the final weights."""
    st = run.student(arm, schema, vm_dir)
    preds = []
    for w in windows:
        if w in val:
            preds.append(st.predict(w))
        if w == windows[-1]:
            break
        st.train_window(w, know if arm.distils else None)
    trained = concat_preds([st.predict(w) for w in fit_on])
    st.close()
    return {
        "validation": measure(concat_preds(preds), know),
        "trained_windows": measure(trained, know),
        "steps": st.steps,
        "serving_flops": st.serving_flops,
    }


def main() -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)
    cfg_path, out_json, root = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    cfg = load_experiment_config(cfg_path, sys.argv[4:])
    seed = cfg.seeds[0]
    dev = resolve_device(cfg.train.device)
    t0 = time.process_time()
    result: dict[str, Any] = {
        "config": cfg_path,
        "overrides": sys.argv[4:],
        "seed": seed,
        "lag": cfg.lag,
        "pure_kd_weight": PURE_KD_WEIGHT,
        "surfaces": {},
    }
    with process_group(dev) as pg, cpu_threads(cfg.threads):
        run = SeedRun(cfg, seed, root, dev, pg)
        val = val_windows(run)
        vm_windows = run.windows[: run.windows.index(val[-1]) + 1]  # 12..14: the evaluation day is left out
        first = next(
            i for i in range(len(run.parts)) if version_for_window(i, cfg.publish_every, cfg.lag) > 0
        )
        long_windows = run.parts[first : run.parts.index(val[-1]) + 1]
        fit_on = [w for w in vm_windows if w not in val[1:]][-2:]  # the last two windows trained on
        sides = {}
        for name, ws in (("vm", vm_windows), ("long", long_windows)):
            kdir = root / f"seed{seed}" / f"diag_knowledge_lag{cfg.lag}_{name}"
            generate(
                root / f"seed{seed}" / "fm",
                run.data,
                kdir,
                lag=cfg.lag,
                partitions=",".join(ws),
                batch_size=cfg.generate_batch_size,
                threads=cfg.threads,
            )
            sides[name] = read_side_table(kdir, ws)
        result.update(vm_windows=vm_windows, long_windows=long_windows, validation=val, fit_on=fit_on)
        for sname in run.surfaces:
            s = run.schema.surfaces.index(sname)
            schema = derive_vm_schema(run.schema, cfg.vm.schema, name=f"vm_{sname}")
            rows: dict[str, Any] = {}
            for name, ws in (("vm", vm_windows), ("long", long_windows)):
                vm_dir = root / f"seed{seed}" / f"diag_vm_{sname}_{name}"
                build_vm_dataset(run.data, [s], vm_dir, None, ws, schema)
                know = KnowledgeTable.from_side_table(
                    sides[name], schema.task_names, cfg.surface_bias, run.window_len
                )
                if name == "vm":
                    rows["baseline_e1"] = progressive(
                        run, ArmConfig("baseline", epochs_per_window=1), schema, vm_dir, know, ws, val, fit_on
                    )
                    for e in EPOCHS:
                        arm = ArmConfig(f"pure_kd_e{e}", kd_weight=PURE_KD_WEIGHT, epochs_per_window=e)
                        rows[f"pure_kd_e{e}"] = progressive(run, arm, schema, vm_dir, know, ws, val, fit_on)
                else:
                    arm = ArmConfig("pure_kd_long_e1", kd_weight=PURE_KD_WEIGHT, epochs_per_window=1)
                    rows["pure_kd_long_e1"] = progressive(run, arm, schema, vm_dir, know, ws, val, fit_on)
            for k in rows:
                v = rows[k]["validation"]
                print(
                    f"{sname:<8}{k:<18}val rows {v['rows']:>6}  VM NE {v['vm_ne']:.4f}  FM NE "
                    f"{v['fm_ne']:.4f}  logit MSE {v['logit_mse']:.4f}  r {v['logit_r']:.3f}  | trained "
                    f"windows: VM NE {rows[k]['trained_windows']['vm_ne']:.4f} r "
                    f"{rows[k]['trained_windows']['logit_r']:.3f}  steps {rows[k]['steps']}",
                    flush=True,
                )
            result["surfaces"][sname] = rows
    result["cpu_seconds"] = time.process_time() - t0
    out_json.write_text(json.dumps(result, indent=2))
    print(f"wrote {out_json} ({result['cpu_seconds']:.0f} CPU s)")


if __name__ == "__main__":
    main()
