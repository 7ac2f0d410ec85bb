"""Does the baseline VM learn from its own window? Calibration round 4, step 1 (docs/TRANSFER.md).

Usage: python vm_fit_sweep.py CONFIG OUT [EPOCHS,...] [LR_MULT,...]  (run under `nice -n 10`).

For every calibration seed of CONFIG and every VM surface, trains the baseline VM (labels only, no FM)
progressively from the VM's first window exactly as ``opengem transfer`` does -- predict a window, then
train on it -- over the first window and the validation windows only, for each cell of
epochs_per_window x lr multiplier (the multiplier scales both ``train.lr`` and ``train.sparse_lr``).
Prints one JSON line per cell x seed x surface: train NE (each trained window after its last epoch,
pooled), validation NE (the validation windows, predicted before training on them, pooled), rows and
the cell's CPU seconds; then the per-cell mean over seeds x surfaces. The evaluation windows are never
read: the sweep stops before the first one. Each seed's stream is simulated into OUT/seed<S>/data (reused
when present, so ``opengem transfer --out OUT`` reuses it too).
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

import numpy as np

from opengem.data.dataset import Dataset
from opengem.train.distributed import process_group
from opengem.train.env import cpu_threads, resolve_device
from opengem.transfer.experiment_config import ExperimentConfig, load_experiment_config
from opengem.transfer.preds import sigmoid
from opengem.transfer.results import ne_of
from opengem.transfer.vertical import build_vm_dataset, derive_vm_schema
from opengem.transfer.vm_train import ArmConfig, ProgressiveStudent
from opengem.transfer.windows import prepare_data, vm_start_window


def pooled_ne(preds: list[dict[str, np.ndarray]]) -> tuple[float, int]:
    """NE of the click task over the concatenated rows of several windows' predictions."""
    logits = np.concatenate([p["logits"][:, 0] for p in preds])
    labels = np.concatenate([p["labels"][:, 0] for p in preds]).astype(np.float64)
    mask = np.concatenate([p["mask"][:, 0] for p in preds]).astype(bool)
    return ne_of(sigmoid(logits[mask]), labels[mask]), int(mask.sum())


def fit_one(cfg: ExperimentConfig, seed: int, vm_dir: Path, schema: object, windows: list[str],
            n_train: int, epochs: int, mult: float, device: object, pg: object) -> dict[str, float]:
    """One baseline VM: train on windows[:n_train], predict windows[1:] before training on them."""
    t = copy.deepcopy(cfg.train)
    t.seed, t.lr, t.sparse_lr = seed, cfg.train.lr * mult, cfg.train.sparse_lr * mult
    st = ProgressiveStudent(schema, cfg.vm, ArmConfig(), t, str(vm_dir), device, pg,
                            batch_size=cfg.batch_size, epochs_per_window=epochs)
    try:
        val, trained = [], []
        for i, w in enumerate(windows):
            if i > 0:
                val.append(st.predict(w))
            if i >= n_train:
                break
            st.train_window(w)
            trained.append(st.predict(w))
    finally:
        st.close()
    val_ne, val_rows = pooled_ne(val)
    train_ne, train_rows = pooled_ne(trained)
    return {"train_ne": train_ne, "train_rows": train_rows, "val_ne": val_ne, "val_rows": val_rows,
            "steps": st.steps}


def main() -> None:
    config, out = sys.argv[1], Path(sys.argv[2])
    epochs_grid = [int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "1,2,4").split(",")]
    mult_grid = [float(x) for x in (sys.argv[4] if len(sys.argv) > 4 else "1,3,10").split(",")]
    cfg = load_experiment_config(config)
    if not cfg.validation_windows:
        raise SystemExit(f"{config}: validation_windows = 0; the sweep picks on validation windows only")
    dev = resolve_device(cfg.train.device)
    cells: dict[tuple[int, float], list[dict[str, float]]] = {}
    with process_group(dev) as pg, cpu_threads(cfg.threads):
        for seed in cfg.seeds:
            root = out / f"seed{seed}"
            root.mkdir(parents=True, exist_ok=True)
            data = prepare_data(cfg, seed, root)
            ds = Dataset(data)
            parts = ds.partitions()
            start = vm_start_window(cfg, sorted({cfg.lag, *cfg.staleness}), len(parts), str(data))
            windows = parts[start: start + 1 + cfg.validation_windows]  # first VM window + validation
            for sname in cfg.surfaces or list(ds.schema.surfaces):
                s = ds.schema.surfaces.index(sname)
                schema = derive_vm_schema(ds.schema, cfg.vm.schema, name=f"vm_{sname}")
                vm_dir = root / f"vmfit_{sname}"
                build_vm_dataset(data, [s], vm_dir, None, windows, schema)
                for epochs in epochs_grid:
                    for mult in mult_grid:
                        c0 = time.process_time()
                        res = fit_one(cfg, seed, vm_dir, schema, windows, cfg.validation_windows, epochs,
                                      mult, dev, pg)
                        res.update(seed=seed, surface=sname, epochs_per_window=epochs, lr_mult=mult,
                                   lr=cfg.train.lr * mult, sparse_lr=cfg.train.sparse_lr * mult,
                                   windows=windows, cpu_s=round(time.process_time() - c0, 1))
                        cells.setdefault((epochs, mult), []).append(res)
                        print(json.dumps(res), flush=True)
    print("\nepochs  lr_mult  mean train NE  mean val NE  (over seeds x surfaces)")
    for (epochs, mult), rs in sorted(cells.items()):
        print(f"{epochs:>6}  {mult:>7g}  {np.mean([r['train_ne'] for r in rs]):>13.4f}  "
              f"{np.mean([r['val_ne'] for r in rs]):>11.4f}")


if __name__ == "__main__":
    main()
