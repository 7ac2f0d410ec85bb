"""The VM training loop: progressive (evaluate a window, then train on it), with pluggable extra losses.

Every step is the one Trainer's (``opengem.train.trainer``): TorchRec DMP with the fused sparse optimizer,
AdamW with its schedule and clipping, precision and the other knobs of ``[train]``. Parameters shared from
the FM get their own (scaled, possibly zero) learning rates through the Trainer's ``lr_scale``.

Loss = masked BCE of the serving head on labels + Σ extra losses. The extra losses come from the arm:
standard KD on the serving logits (soft-label BCE at temperature T and/or logit MSE), or, with the
Auxiliary Head, the same KD on the aux head's logits (serving head: labels only). The teacher is a
:class:`~opengem.transfer.knowledge.KnowledgeTable` (FM side table, optionally through the Student
Adapter, or a domain FM's predictions); its logits are never differentiated.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from opengem.data.batch import Batch
from opengem.data.loader import ParquetLoader
from opengem.errors import TrainError
from opengem.train.config import DataConfig, RunConfig, TrainConfig
from opengem.train.trainer import Trainer
from opengem.transfer.distill import kd_bce, logit_mse
from opengem.transfer.knowledge import KnowledgeTable
from opengem.transfer.sharing import share_fm_parameters
from opengem.transfer.vertical import VerticalModel, VMConfig


@dataclass
class ArmConfig:
    """One transfer arm: composable switches over the VM's training (all off = the baseline VM)."""

    name: str = "baseline"
    kd_weight: float = 0.0  # soft-label BCE weight (0 = no KD)
    kd_temperature: float = 1.0
    kd_mse_weight: float = 0.0  # logit MSE weight
    aux_head: bool = False  # distil through an auxiliary head on the trunk (ExFM); serving head: labels only
    aux_grad_scale: float = 1.0
    aux_label_scale: float = 1.0
    adapter: bool = False  # distil from the Student Adapter's output instead of the raw FM logit
    fm_embeddings: bool = False  # FM embeddings as VM input features (schema with fm_* dense features)
    share: str = "none"  # none | init | lowlr | frozen: FM embedding-layer components in the VM
    share_lr_scale: float = 0.1  # lr multiplier of shared components for "lowlr"
    share_sequence_encoder: bool = False  # also run the FM's sequence encoder (copied) inside the VM
    share_encoder_mode: str = "frozen"  # frozen | lowlr (share_lr_scale): the copied FM history path
    # passes over each window for this arm (0 = the caller's epochs_per_window): the experiment's per-arm
    # training length (arm_epochs / tune_epochs), since the best length differs by arm
    epochs_per_window: int = 0

    @property
    def distils(self) -> bool:
        return self.kd_weight > 0 or self.kd_mse_weight > 0


ExtraLoss = Callable[[Any, Batch, dict[str, torch.Tensor]], torch.Tensor]


def kd_losses(arm: ArmConfig) -> list[tuple[str, ExtraLoss]]:
    """The arm's extra losses; each reads the model output, the batch and the teacher tensors."""
    key = "aux_logits" if arm.aux_head else None
    losses: list[tuple[str, ExtraLoss]] = []

    def student(out: Any) -> torch.Tensor:
        return out.extras[key] if key else out.logits

    if arm.kd_weight > 0:
        losses.append(
            (
                "kd_bce",
                lambda out, b, t: (
                    arm.kd_weight
                    * kd_bce(
                        student(out),
                        t["logits"],
                        t["mask"],
                        arm.kd_temperature,
                        arm.aux_label_scale if arm.aux_head else 1.0,
                    )
                ),
            )
        )
    if arm.kd_mse_weight > 0:
        losses.append(
            ("kd_mse", lambda out, b, t: arm.kd_mse_weight * logit_mse(student(out), t["logits"], t["mask"]))
        )
    return losses


def teacher_tensors(batch: Batch, teacher: KnowledgeTable | None, num_tasks: int, device: torch.device,
                    use_adapter: bool) -> dict[str, torch.Tensor]:
    """The teacher's logits for a batch's rows and where they exist (``kd_losses``' ``t``), by example id."""
    if teacher is None:
        z = torch.zeros(batch.batch_size, num_tasks, device=device)
        return {"logits": z, "mask": z.bool()}
    lg, ok = teacher.lookup(batch.example_id.cpu().numpy(), batch.surface.cpu().numpy(),
                            use_adapter=use_adapter)
    return {"logits": torch.as_tensor(lg, device=device), "mask": torch.as_tensor(ok, device=device)}


class ProgressiveStudent:
    """A VM (or domain FM) trained window by window; ``evaluate`` before ``train`` on each window.

    A thin user of :class:`~opengem.train.trainer.Trainer`: the VM (with any FM parameters shared into
    it) is built here and handed to the Trainer with its learning-rate scales; every step is
    ``Trainer.train_step`` with this arm's distillation losses hooked in, so ``train.precision``, FP8
    saved activations, compile and activation checkpointing apply to vertical models as to any run.
    """

    def __init__(
        self,
        schema: Any,
        vm_cfg: VMConfig,
        arm: ArmConfig,
        train_cfg: TrainConfig,
        data_dir: str,
        device: torch.device,
        pg: Any,  # noqa: ARG002  (the Trainer joins the process group the caller opened)
        batch_size: int = 256,
        epochs_per_window: int = 1,
        fm_model: nn.Module | None = None,
        extra_losses: list[tuple[str, ExtraLoss]] | None = None,
    ) -> None:
        self.schema, self.arm, self.t, self.device = schema, arm, train_cfg, device
        self.batch_size, self.epochs = batch_size, arm.epochs_per_window or epochs_per_window
        model_cfg = copy.deepcopy(vm_cfg.model)
        if train_cfg.compile:  # static sequence shapes, as prepare_compile sets for any compiled run
            model_cfg.embedding.pad_to_max_len = True
        torch.manual_seed(train_cfg.seed)
        plain = VerticalModel(schema, model_cfg, aux_head=arm.aux_head, aux_grad_scale=arm.aux_grad_scale)
        self.plain = plain
        # the VM's own model, what vm.flops_budget bounds; serving_flops adds the FM blocks an arm runs at
        # serving time (shared sequence encoder), which are reported as added compute, not budgeted
        self.own_flops = self.serving_flops = plain.flops_per_example()
        self.shared: dict[str, int] = {}
        if arm.share != "none":
            if fm_model is None:
                raise ValueError(f"arm {arm.name!r}: share = {arm.share!r} needs an FM model")
            self.shared = share_fm_parameters(plain, fm_model)
        enc_ids: set[int] = set()
        if arm.share_sequence_encoder:
            if fm_model is None:
                raise ValueError(f"arm {arm.name!r}: share_sequence_encoder needs an FM model")
            if arm.share_encoder_mode not in ("frozen", "lowlr"):
                raise ValueError(
                    f"arm {arm.name!r}: share_encoder_mode = {arm.share_encoder_mode!r} is not frozen | lowlr"
                )
            names = set(plain.attach_shared_history(fm_model))
            self.serving_flops = plain.flops_per_example()
            for n, p in plain.named_parameters():
                if n in names:
                    self.shared[n] = p.numel()
                    enc_ids.add(id(p))
                    p.requires_grad_(arm.share_encoder_mode != "frozen")
        share_scale = {"none": 1.0, "init": 1.0, "lowlr": arm.share_lr_scale, "frozen": 0.0}[arm.share]
        lr_scale: dict[int, float] = {}
        for n, p in plain.named_parameters():
            if id(p) in enc_ids:
                if p.requires_grad:  # lowlr; a frozen copy has no gradient and no optimizer
                    lr_scale[id(p)] = arm.share_lr_scale
            elif n in self.shared and share_scale != 1.0:
                lr_scale[id(p)] = share_scale
        run_cfg = RunConfig(model=model_cfg, train=copy.deepcopy(train_cfg),
                            data=DataConfig(path=str(data_dir), batch_size=batch_size))
        run_cfg.train.device = device.type
        run_cfg.train.progress = False
        self.trainer = Trainer(run_cfg, None, data_dir, schema=schema, plain=plain, lr_scale=lr_scale)
        self.ds = self.trainer.ds
        self.model = self.trainer.model
        self.losses = kd_losses(arm) + list(extra_losses or [])
        self.steps = 0
        self.loss_log: list[dict[str, float]] = []

    def loader(self, window: str, train: bool) -> ParquetLoader:
        return ParquetLoader(
            self.ds.files(window),
            self.schema,
            self.batch_size,
            drop_last=False,
            shuffle_units=train,
            seed=self.t.seed,
        )

    def teacher_tensors(self, batch: Batch, teacher: KnowledgeTable | None) -> dict[str, torch.Tensor]:
        return teacher_tensors(batch, teacher, len(self.schema.tasks), self.device, self.arm.adapter)

    def train_window(self, window: str, teacher: KnowledgeTable | None = None) -> None:
        if self.losses and teacher is None and self.arm.distils:
            raise ValueError(f"arm {self.arm.name!r} distils but has no teacher")

        def extra(out: Any, batch: Batch) -> dict[str, torch.Tensor]:
            t = self.teacher_tensors(batch, teacher)
            return {name: fn(out, batch, t) for name, fn in self.losses}

        self.trainer.extra_losses = extra if self.losses else None
        for _ in range(self.epochs):
            for batch in self.loader(window, train=True):
                try:
                    lv = self.trainer.train_step(batch)
                except TrainError as e:
                    raise TrainError(f"arm {self.arm.name!r}, window {window}: {e}") from None
                self.steps += 1
                self.loss_log.append(self.trainer.last_parts or {"label": lv})

    def close(self) -> None:
        """Release what the Trainer holds (a private process group when the caller opened none)."""
        self.trainer.close()

    @torch.no_grad()
    def predict(self, window: str, surfaces: list[int] | None = None) -> dict[str, np.ndarray]:
        """Serving-head logits on a window: example_id, surface, logits [N, T], labels, mask."""
        self.model.eval()
        ids, surf, logits, labels, mask = [], [], [], [], []
        for batch in self.loader(window, train=False):
            out = self.model(batch.to(self.device))
            ids.append(batch.example_id.numpy())
            surf.append(batch.surface.numpy())
            logits.append(out.logits.float().cpu().numpy())
            labels.append(batch.labels.numpy())
            mask.append(batch.label_mask.numpy())
        res = {
            "example_id": np.concatenate(ids),
            "surface": np.concatenate(surf),
            "logits": np.concatenate(logits),
            "labels": np.concatenate(labels),
            "mask": np.concatenate(mask),
        }
        if surfaces is not None:
            keep = np.isin(res["surface"], surfaces)
            res = {k: v[keep] for k, v in res.items()}
        return res


def clone_arm(arm: ArmConfig, **changes: Any) -> ArmConfig:
    out = copy.deepcopy(arm)
    for k, v in changes.items():
        setattr(out, k, v)
    return out
