"""The one Trainer with a teacher: KD losses, and the Auxiliary Head kept outside the served model.

Why the auxiliary head is not a submodule of the model: RUN/checkpoints must hold exactly the model that
RUN/config.toml describes, so that ``opengem evaluate``/``predict``/``report`` rebuild and load it like any
run. The head (ExFM: a training-time distillation head on the shared trunk) is therefore a separate
``nn.Linear`` that reads ``ModelOutput.trunk`` through ``grad_scale``; its loss joins the Trainer's loss
through ``extra_losses``, so the trunk gets its gradient in the Trainer's own backward, and its weights
take an AdamW step (lr = ``train.lr``, no schedule) right after each ``train_step``. Its weights and
optimizer state ride in the checkpoint's JSON counters (:meth:`state_dict`: a few hundred numbers, exact
as JSON), so ``--resume`` continues it exactly as it continues the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from opengem.data.batch import Batch
from opengem.model.output import ModelOutput
from opengem.train import distributed
from opengem.train.config import RunConfig
from opengem.train.env import resolve_device
from opengem.train.trainer import Trainer
from opengem.transfer.distill import grad_scale
from opengem.transfer.knowledge import KnowledgeTable
from opengem.transfer.vm_train import ArmConfig, kd_losses, teacher_tensors


class DistillTrainer(Trainer):
    """A :class:`Trainer` whose loss adds the arm's distillation terms against ``teacher``.

    ``trunk_width``: the width of ``ModelOutput.trunk`` (the aux head's input). ``teacher`` may be
    replaced between steps (online: a new side table per window). ``windows_done`` is carried by the
    checkpoint (online distillation resumes after the last window it trained).
    """

    def __init__(self, cfg: RunConfig, run_dir: str | Path | None, data_dir: str | Path | None, *,
                 arm: ArmConfig, teacher: KnowledgeTable | None, trunk_width: int, num_tasks: int,
                 **trainer_kwargs: Any) -> None:
        self.arm, self.teacher, self.num_tasks = arm, teacher, num_tasks
        self.windows_done: list[str] = []
        self.aux_head: nn.Linear | None = None
        self.aux_opt: torch.optim.Optimizer | None = None
        if arm.aux_head:  # before the Trainer: a resume loads its state while the Trainer is built
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(cfg.train.seed + 1)
                self.aux_head = nn.Linear(trunk_width, num_tasks).to(resolve_device(cfg.train.device))
            self.aux_opt = torch.optim.AdamW(self.aux_head.parameters(), lr=cfg.train.lr,
                                             weight_decay=cfg.train.weight_decay)
        self.losses = kd_losses(arm)
        super().__init__(cfg, run_dir, data_dir, extra_losses=self._distill_losses if self.losses else None,
                         **trainer_kwargs)

    def _distill_losses(self, out: ModelOutput, batch: Batch) -> dict[str, torch.Tensor]:
        t = teacher_tensors(batch, self.teacher, self.num_tasks, self.device, self.arm.adapter)
        if self.aux_head is not None:
            out.extras["aux_logits"] = self.aux_head(grad_scale(out.trunk.float(), self.arm.aux_grad_scale))
        return {name: fn(out, batch, t) for name, fn in self.losses}

    def train_step(self, batch: Batch) -> float:
        loss = super().train_step(batch)
        if self.aux_opt is not None:
            if self.world > 1:  # the loss is each rank's share of the global mean: gradients add up
                for p in self.aux_head.parameters():
                    if p.grad is not None:
                        p.grad = distributed.all_reduce_sum(p.grad)
            self.aux_opt.step()
            self.aux_opt.zero_grad(set_to_none=True)
        return loss

    def aux_parameters(self) -> list[nn.Parameter]:
        return list(self.aux_head.parameters()) if self.aux_head is not None else []

    # ----------------------------------------------------------------------- checkpointed state
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["distill"] = {
            "windows_done": list(self.windows_done),
            "aux_head": _to_json(self.aux_head.state_dict()) if self.aux_head is not None else None,
            "aux_optim": _to_json(self.aux_opt.state_dict()) if self.aux_opt is not None else None,
        }
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        mine = state.get("distill") or {}
        self.windows_done = list(mine.get("windows_done") or [])
        if self.aux_head is not None and mine.get("aux_head") is not None:
            self.aux_head.load_state_dict(_from_json(mine["aux_head"]))  # copied onto its device
            opt = _from_json(mine["aux_optim"])  # load_state_dict moves the state to the parameters' device
            opt["state"] = {int(k): v for k, v in opt["state"].items()}
            self.aux_opt.load_state_dict(opt)


_TENSOR = "__tensor__"


def _to_json(obj: Any) -> Any:
    """Tensors as nested lists (float32 survives the trip through JSON's doubles exactly)."""
    if isinstance(obj, torch.Tensor):
        return {_TENSOR: obj.detach().cpu().tolist(), "dtype": str(obj.dtype).removeprefix("torch.")}
    if isinstance(obj, dict):
        return {str(k): _to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_json(v) for v in obj]
    return obj


def _from_json(obj: Any) -> Any:
    if isinstance(obj, dict) and _TENSOR in obj:
        return torch.tensor(obj[_TENSOR], dtype=getattr(torch, obj["dtype"]))
    if isinstance(obj, dict):
        return {k: _from_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_from_json(v) for v in obj]
    return obj
