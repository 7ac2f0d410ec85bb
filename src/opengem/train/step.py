"""The training step, in two halves, shared by the trainer, online training and the benchmark.

Split in two because the distributed trainer rescales the loss between them (each rank's share of the
global-batch mean); everything else about a step -- precision, FP8 saved activations, the masked loss,
dense gradient scaling and clipping, the optimizer and the schedule -- must be identical wherever a
step is taken, or a benchmark measures a different step from the one that trains.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from opengem.data.batch import Batch
from opengem.data.schema import FeatureSchema
from opengem.model.heads import masked_bce
from opengem.model.output import ModelOutput
from opengem.train.config import TrainConfig
from opengem.train.memory import autocast, maybe_fp8_saved_activations
from opengem.train.optim import clip_dense_gradients


def task_weights(schema: FeatureSchema, device: torch.device) -> torch.Tensor:
    """The schema's task weights as the loss takes them (the one place they are built)."""
    return torch.tensor([t.weight for t in schema.tasks], dtype=torch.float32, device=device)


def forward(model: nn.Module, batch: Batch, t: TrainConfig, device: torch.device) -> ModelOutput:
    """The training forward under the configured precision and saved-activation format."""
    if not all(m.training for m in model.modules()):  # reading the flags is ~4x cheaper than setting them
        model.train()
    with (autocast(t.precision, device, t.cpu_bf16_thin),
          maybe_fp8_saved_activations(t.fp8_saved_activations, t.fp8_min_numel)):
        return model(batch)


def label_loss(out: ModelOutput, batch: Batch, weights: torch.Tensor) -> torch.Tensor:
    """The masked, task-weighted BCE of the serving logits (in fp32 whatever the forward's precision)."""
    return masked_bce(out.logits.float(), batch.labels, batch.label_mask, weights)


def forward_loss(model: nn.Module, batch: Batch, weights: torch.Tensor, t: TrainConfig,
                 device: torch.device) -> torch.Tensor:
    return label_loss(forward(model, batch, t, device), batch, weights)


def optimizer_step(loss: torch.Tensor, opt: torch.optim.Optimizer, sched: Any, dense: list[nn.Parameter],
                   grad_clip: float, grad_scale: float = 1.0) -> float:
    """Backward (the fused sparse optimizer steps inside it), dense clip and step; returns the grad norm."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    return dense_step(opt, sched, dense, grad_clip, grad_scale)


def dense_step(opt: torch.optim.Optimizer, sched: Any, dense: list[nn.Parameter], grad_clip: float,
               grad_scale: float = 1.0) -> float:
    """After backward: dense gradient scaling and clipping, the dense step and the schedule; the grad norm.

    Its own function because TorchRec's train pipeline runs zero_grad and backward itself and then calls
    the optimizer's ``step`` (opengem.train.pipeline), which must still be this step."""
    if grad_scale != 1:  # FSDP averaged over ranks; the global-batch gradient is their sum
        for p in dense:
            if p.grad is not None:
                p.grad.mul_(grad_scale)
    gnorm = clip_dense_gradients(dense, grad_clip)
    opt.step()
    sched.step()
    return gnorm
