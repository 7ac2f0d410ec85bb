"""The arms of the transfer experiment, each a composition of switches over one VM's training."""

from __future__ import annotations

from typing import Any

import numpy as np

from opengem.transfer.experiment_config import ExperimentConfig
from opengem.transfer.preds import sigmoid
from opengem.transfer.results import ne_of
from opengem.transfer.vm_train import ArmConfig, clone_arm


def arm_configs(cfg: ExperimentConfig, kd_best: list[float],
                epochs: dict[str, int] | None = None) -> dict[str, ArmConfig]:
    """Every arm from one KD point (each distilling arm derives its weight from it, so none gets more tuning
    than KD) and each arm's epochs per window: ``epochs[arm]`` when given (tuned), else the config's."""
    w, temp = kd_best[0], kd_best[1]
    mse = kd_best[2] if len(kd_best) > 2 else cfg.kd.mse_weight
    kd = ArmConfig("kd", kd_weight=w, kd_temperature=temp, kd_mse_weight=mse)
    aux = clone_arm(
        kd,
        name="aux_head",
        aux_head=True,
        aux_grad_scale=cfg.aux.grad_scale,
        aux_label_scale=cfg.aux.label_scale,
        kd_weight=w * cfg.aux.weight_scale,
    )
    sa = clone_arm(aux, name="student_adapter", adapter=True)
    emb = clone_arm(sa, name="fm_embeddings", fm_embeddings=True)
    share = clone_arm(
        emb,
        name="param_sharing",
        share=cfg.sharing.mode,
        share_lr_scale=cfg.sharing.lr_scale,
        share_sequence_encoder=cfg.sharing.sequence_encoder,
        share_encoder_mode=cfg.sharing.encoder_mode,
    )
    hier = clone_arm(aux, name="hierarchical")
    out = {
        "baseline": ArmConfig(),
        "kd": kd,
        "aux_head": aux,
        "student_adapter": sa,
        "fm_embeddings": emb,
        "param_sharing": share,
        "hierarchical": hier,
    }
    for name, arm in out.items():
        arm.epochs_per_window = (epochs or {}).get(name, cfg.epochs_for(name))
    return out


def ne_by_surface(seed_res: dict[str, Any], pick: Any) -> dict[str, list[float]]:
    """NE of one run's predictions (``pick(surface_result)``) per surface, one per task with both labels."""
    out: dict[str, list[float]] = {}
    for sname, r in seed_res.items():
        run = pick(r)
        out[sname] = []
        for t in range(len(r["tasks"])):
            m = run["mask"][:, t]
            if m.any() and 0 < run["labels"][m, t].mean() < 1:
                out[sname].append(ne_of(sigmoid(run["logits"][m, t]), run["labels"][m, t].astype(np.float64)))
    return out
