"""What every opengem model returns, so that one trainer, evaluator and transfer path serve them all."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class ModelOutput:
    logits: torch.Tensor  # [B, T]: one logit per task, from the head of the example's own surface
    trunk: torch.Tensor  # [B, H]: the shared representation the heads read (exported for transfer)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # e.g. user/ad embeddings
