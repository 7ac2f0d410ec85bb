"""Student Adapter (ExFM): a tiny model per VM that re-fits the FM's prediction to the freshest labels.

The FM is stale (trained through an older window) and may be biased on a surface; the adapter maps the
FM logit (optionally with the surface and the FM's age) to a corrected logit, trained on the labels of
the newest window only. The VM then distils from the adapter's *detached* output. The adapter exists
only at training time: it is never in the serving path and adds no serving FLOPs.

Form: ``out = fm_logit + linear(z) + MLP(z)`` per task with ``z = [fm_logit, onehot(surface), age]``.
The linear part is Platt-style recalibration (per-surface offset, logit slope, age drift): the
corrections a stale or surface-biased FM actually needs. The optional MLP adds a non-linear residual.
Both start at zero, so an untrained adapter is exactly the identity.

Why a ridge penalty on the weights and a seeded init: a window holds few positives (tens to hundreds on
the small streams), and an unregularised MLP fit full-batch on them chases label noise and extrapolates
badly outside the bulk of the FM's logits. Shrinking the weights towards zero (= towards the identity)
means the adapter only moves the FM where the labels give real evidence, and the seed makes a refit
independent of whatever else consumed the global torch RNG (test order, other arms).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class AdapterConfig:
    hidden: int = 16  # MLP residual width (0 = Platt-style linear recalibration only)
    use_surface: bool = True
    use_age: bool = True
    steps: int = 200  # full-batch Adam steps per refit (the window's rows are few and cheap)
    lr: float = 0.02
    l2_to_identity: float = 1e-3  # penalty on the mean squared correction
    ridge: float = 1e-2  # L2 on every adapter weight (shrinks towards the identity without signal)
    seed: int = 0  # the MLP's init seed (the linear part starts at zero)


class StudentAdapter(nn.Module):
    def __init__(self, num_tasks: int, num_surfaces: int, cfg: AdapterConfig) -> None:
        super().__init__()
        if cfg.hidden < 0 or cfg.ridge < 0 or cfg.l2_to_identity < 0:
            raise ValueError("adapter.hidden / adapter.ridge / adapter.l2_to_identity: must be >= 0")
        self.cfg, self.num_tasks, self.num_surfaces = cfg, num_tasks, num_surfaces
        in_dim = num_tasks + (num_surfaces if cfg.use_surface else 0) + (1 if cfg.use_age else 0)
        gen = torch.Generator().manual_seed(cfg.seed)
        self.linear = nn.Linear(in_dim, num_tasks)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.net: nn.Sequential | None = None
        if cfg.hidden:
            self.net = nn.Sequential(
                nn.Linear(in_dim, cfg.hidden), nn.Tanh(), nn.Linear(cfg.hidden, num_tasks)
            )
            first = self.net[0]
            bound = 1 / in_dim**0.5
            with torch.no_grad():
                first.weight.uniform_(-bound, bound, generator=gen)
                first.bias.uniform_(-bound, bound, generator=gen)
            nn.init.zeros_(self.net[2].weight)
            nn.init.zeros_(self.net[2].bias)

    def _features(self, fm_logit: torch.Tensor, surface: torch.Tensor, age: torch.Tensor) -> torch.Tensor:
        parts = [fm_logit]
        if self.cfg.use_surface:
            parts.append(F.one_hot(surface.long(), self.num_surfaces).to(fm_logit.dtype))
        if self.cfg.use_age:
            parts.append(age.to(fm_logit.dtype).reshape(-1, 1))
        return torch.cat(parts, dim=1)

    def correction(self, fm_logit: torch.Tensor, surface: torch.Tensor, age: torch.Tensor) -> torch.Tensor:
        z = self._features(fm_logit, surface, age)
        out = self.linear(z)
        return out if self.net is None else out + self.net(z)

    def forward(self, fm_logit: torch.Tensor, surface: torch.Tensor, age: torch.Tensor) -> torch.Tensor:
        return fm_logit + self.correction(fm_logit, surface, age)

    def _ridge(self) -> torch.Tensor:
        """Sum of squared weights; the MLP's hidden layer only counts through its (zero-started) output."""
        pen = self.linear.weight.pow(2).sum() + self.linear.bias.pow(2).sum()
        if self.net is not None:
            pen = pen + self.net[2].weight.pow(2).sum() + self.net[2].bias.pow(2).sum()
        return pen

    def fit(
        self, fm_logit: np.ndarray, labels: np.ndarray, mask: np.ndarray, surface: np.ndarray, age: np.ndarray
    ) -> float:
        """Refit on one window's rows (mask: label observed and FM available); returns the final loss."""
        x = torch.as_tensor(np.nan_to_num(fm_logit), dtype=torch.float32)
        y = torch.as_tensor(np.nan_to_num(labels), dtype=torch.float32)
        m = torch.as_tensor(mask, dtype=torch.bool)
        if x.shape != y.shape or m.shape != x.shape:
            raise ValueError(f"adapter.fit: fm_logit {tuple(x.shape)}, labels {tuple(y.shape)}, mask "
                             f"{tuple(m.shape)} must have the same [rows, tasks] shape")
        if not bool(m.any()):
            return float("nan")
        s = torch.as_tensor(surface, dtype=torch.long)
        a = torch.as_tensor(age, dtype=torch.float32)
        opt = torch.optim.Adam(self.parameters(), lr=self.cfg.lr)
        loss = torch.zeros(())
        for _ in range(self.cfg.steps):
            corr = self.correction(x, s, a)
            bce = F.binary_cross_entropy_with_logits(x + corr, y, reduction="none")
            loss = (
                (bce * m).sum() / m.sum()
                + self.cfg.l2_to_identity * (corr[m] ** 2).mean()
                + self.cfg.ridge * self._ridge()
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
        return float(loss.detach())

    @torch.no_grad()
    def corrected(self, fm_logit: torch.Tensor, surface: torch.Tensor, age: torch.Tensor) -> torch.Tensor:
        """The corrected teacher logit, detached (the VM distils from it; nothing flows back)."""
        return (
            self(torch.nan_to_num(fm_logit), surface, age).detach().where(torch.isfinite(fm_logit), fm_logit)
        )
