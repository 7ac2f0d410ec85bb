"""Distillation losses: standard KD and the pieces of ExFM's Auxiliary Head.

Every loss takes student logits [B, T], teacher logits [B, T] and a mask [B, T] (True where a teacher
prediction exists for a task the student learns) and averages over the mask, so rows without an FM
version (too early, see versions.py) simply do not distil. The teacher is always detached here: the
FM, the student adapter and a domain FM are never trained by a VM's loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

EPS = 1e-6


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp(min=1.0)


def teacher_probs(
    teacher_logits: torch.Tensor, temperature: float = 1.0, label_scale: float = 1.0
) -> torch.Tensor:
    """Soft labels sigmoid(t / T), multiplied by ``label_scale`` (ExFM's label scaling) and kept in (0, 1)."""
    if temperature <= 0:
        raise ValueError(f"kd temperature must be > 0, got {temperature}")
    p = torch.sigmoid(teacher_logits.detach() / temperature) * label_scale
    return p.clamp(EPS, 1 - EPS)


def kd_bce(
    student: torch.Tensor,
    teacher: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
    label_scale: float = 1.0,
) -> torch.Tensor:
    """Soft-label BCE at temperature T, times T² so gradients keep their scale as T changes (Hinton)."""
    if student.shape != teacher.shape or student.shape != mask.shape:
        raise ValueError(
            f"kd_bce: student {tuple(student.shape)}, teacher {tuple(teacher.shape)}, mask "
            f"{tuple(mask.shape)} must match"
        )
    mask = mask & torch.isfinite(teacher)
    t = torch.where(mask, teacher, torch.zeros_like(teacher))
    target = teacher_probs(t, temperature, label_scale)
    loss = F.binary_cross_entropy_with_logits(student / temperature, target, reduction="none")
    return _masked_mean(loss, mask) * temperature**2


def logit_mse(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error between logits (regresses the teacher's margin, not only its probability)."""
    mask = mask & torch.isfinite(teacher)
    t = torch.where(mask, teacher, torch.zeros_like(teacher)).detach()
    return _masked_mean((student - t) ** 2, mask)


class _GradScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:  # type: ignore[override]
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad * ctx.scale, None


def grad_scale(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Identity forward; multiplies the gradient by ``scale`` (ExFM's gradient scaling into the trunk)."""
    if scale == 1.0:
        return x
    return _GradScale.apply(x, scale)
