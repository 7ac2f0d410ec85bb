"""The VM training loop: progressive (evaluate a window, then train on it), with pluggable extra losses.

It reuses the trainer's pieces: the model goes through ``shard_model`` (TorchRec DMP, fused row-wise
Adagrad on the tables via ``apply_sparse_optimizer``-style in-backward optimizers) and the dense part
gets ``build_dense_optimizer`` (AdamW) + ``build_scheduler`` + ``clip_dense_gradients``. Parameters
shared from the FM get their own (scaled, possibly zero) learning rates.

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
from torchrec.optim import RowWiseAdagrad, apply_optimizer_in_backward

from opengem.data.batch import Batch
from opengem.data.dataset import Dataset
from opengem.data.loader import ParquetLoader
from opengem.model.heads import masked_bce
from opengem.train.config import TrainConfig
from opengem.train.optim import (
    SPARSE_CLASSES,
    build_dense_optimizer,
    build_scheduler,
    clip_dense_gradients,
    dense_parameters,
    embedding_modules,
)
from opengem.train.trainer import shard_model
from opengem.transfer.distill import kd_bce, logit_mse
from opengem.transfer.knowledge import KnowledgeTable
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


class ProgressiveStudent:
    """A VM (or domain FM) trained window by window; ``evaluate`` before ``train`` on each window."""

    def __init__(
        self,
        schema: Any,
        vm_cfg: VMConfig,
        arm: ArmConfig,
        train_cfg: TrainConfig,
        data_dir: str,
        device: torch.device,
        pg: Any,
        batch_size: int = 256,
        epochs_per_window: int = 1,
        fm_model: nn.Module | None = None,
        extra_losses: list[tuple[str, ExtraLoss]] | None = None,
    ) -> None:
        self.schema, self.arm, self.t, self.device = schema, arm, train_cfg, device
        self.ds = Dataset(data_dir, schema)
        self.batch_size, self.epochs = batch_size, epochs_per_window
        torch.manual_seed(train_cfg.seed)
        plain = VerticalModel(schema, vm_cfg.model, aux_head=arm.aux_head, aux_grad_scale=arm.aux_grad_scale)
        self.plain = plain
        self.serving_flops = plain.flops_per_example()
        self.shared: dict[str, int] = {}
        if arm.share != "none":
            if fm_model is None:
                raise ValueError(f"arm {arm.name!r}: share = {arm.share!r} needs an FM model")
            from opengem.transfer.sharing import share_fm_parameters

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
        shared_ids = {id(p) for n, p in plain.named_parameters() if n in self.shared and id(p) not in enc_ids}
        lr_scale = {"none": 1.0, "init": 1.0, "lowlr": arm.share_lr_scale, "frozen": 0.0}[arm.share]
        self._apply_sparse(plain, shared_ids, lr_scale)
        self.model = shard_model(plain, device, pg)
        dense = dense_parameters(self.model)
        own = {n: p for n, p in dense.items() if id(p) not in shared_ids and id(p) not in enc_ids}
        self.opt = build_dense_optimizer(own, train_cfg)
        shared_dense = [p for p in dense.values() if id(p) in shared_ids]
        if shared_dense:
            if lr_scale == 0.0:
                for p in shared_dense:
                    p.requires_grad_(False)
            else:
                self.opt.add_param_group(
                    {"params": shared_dense, "lr": train_cfg.lr * lr_scale, "weight_decay": 0.0}
                )
        enc_dense = [p for p in dense.values() if id(p) in enc_ids]
        if enc_dense:  # lowlr (frozen ones have requires_grad False, so dense_parameters skips them)
            self.opt.add_param_group(
                {"params": enc_dense, "lr": train_cfg.lr * arm.share_lr_scale, "weight_decay": 0.0}
            )
        self.sched = build_scheduler(self.opt, train_cfg)
        self.dense_list = [p for p in dense.values() if p.requires_grad]
        self.weights = torch.tensor([t.weight for t in schema.tasks], dtype=torch.float32, device=device)
        self.losses = kd_losses(arm) + list(extra_losses or [])
        self.steps = 0
        self.loss_log: list[dict[str, float]] = []

    def _apply_sparse(self, model: nn.Module, shared_ids: set[int], lr_scale: float) -> None:
        cls = SPARSE_CLASSES[self.t.sparse_optimizer]
        own, shared = [], []
        for m in embedding_modules(model):
            for p in m.parameters():
                (shared if id(p) in shared_ids else own).append(p)
        for params, lr in ((own, self.t.sparse_lr), (shared, self.t.sparse_lr * lr_scale)):
            if not params:
                continue
            kw: dict[str, float] = {"lr": lr}
            if cls is not SPARSE_CLASSES["sgd"]:
                kw["eps"] = self.t.sparse_eps
            apply_optimizer_in_backward(cls if lr > 0 else RowWiseAdagrad, params, kw)

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
        T = len(self.schema.tasks)
        if teacher is None:
            z = torch.zeros(batch.batch_size, T, device=self.device)
            return {"logits": z, "mask": z.bool()}
        lg, ok = teacher.lookup(
            batch.example_id.cpu().numpy(), batch.surface.cpu().numpy(), use_adapter=self.arm.adapter
        )
        return {
            "logits": torch.as_tensor(lg, device=self.device),
            "mask": torch.as_tensor(ok, device=self.device),
        }

    def train_window(self, window: str, teacher: KnowledgeTable | None = None) -> None:
        if self.losses and teacher is None and self.arm.distils:
            raise ValueError(f"arm {self.arm.name!r} distils but has no teacher")
        for _ in range(self.epochs):
            for batch in self.loader(window, train=True):
                self.model.train()
                batch = batch.to(self.device)
                out = self.model(batch)
                loss = masked_bce(out.logits, batch.labels, batch.label_mask, self.weights)
                rec = {"label": float(loss.detach())}
                if self.losses:
                    t = self.teacher_tensors(batch, teacher)
                    for name, fn in self.losses:
                        extra = fn(out, batch, t)
                        rec[name] = float(extra.detach())
                        loss = loss + extra
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"arm {self.arm.name!r}, window {window}: loss is {float(loss)}")
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                clip_dense_gradients(self.dense_list, self.t.grad_clip)
                self.opt.step()
                self.sched.step()
                self.steps += 1
                self.loss_log.append(rec)

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
