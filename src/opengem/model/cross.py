"""DCNv2's cross network (arXiv 2008.13535), shared by DCNv2 and GEM's optional cross branch."""

from __future__ import annotations

import torch
from torch import nn

from opengem.model.flops import linear_flops


class CrossLayer(nn.Module):
    """x_{l+1} = x0 ⊙ (W x_l + b) + x_l, with W full-rank or U Vᵀ of rank ``rank``.

    The product is element by element, so every latent dimension of one field meets every dimension of every
    other field with its own weight: unlike a dot product of whole embeddings (FM, DLRM, Wukong), the
    surface head downstream can weigh each dimension of a cross differently per surface."""

    def __init__(self, dim: int, rank: int = 0) -> None:
        super().__init__()
        self.dim, self.rank = dim, rank
        if rank:
            self.v = nn.Linear(dim, rank, bias=False)
            self.u = nn.Linear(rank, dim)
        else:
            self.w = nn.Linear(dim, dim)

    def forward(self, x0: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        wx = self.u(self.v(x)) if self.rank else self.w(x)
        return x0 * wx + x

    def flops_per_example(self) -> int:
        return 2 * linear_flops(self.dim, self.rank) if self.rank else linear_flops(self.dim, self.dim)


class CrossNetwork(nn.ModuleList):
    """``layers`` cross layers applied in turn to x0; with none, x0 itself. A ModuleList, so parameter names
    (``cross.0.w.weight``) are those of a plain list of layers."""

    def __init__(self, dim: int, layers: int, rank: int = 0) -> None:
        super().__init__([CrossLayer(dim, rank) for _ in range(layers)])

    def forward(self, x0: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        x = x0
        for layer in self:
            x = layer(x0, x)
        return x

    def flops_per_example(self) -> int:
        return sum(layer.flops_per_example() for layer in self)
