"""A synthetic model with many distinct kernels, for benchmarks of kernel tuning at scale.

Branch i reads the input's first i+1 columns, so each branch's kernel has a shape of its own
and is a distinct kernel (a cache item of its own); nothing is shared between branches.
"""

from __future__ import annotations

import torch
from torch import nn


class Wide(nn.Module):
    def __init__(self, branches: int = 200) -> None:
        super().__init__()
        self.branches = branches
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, branches + 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [torch.tanh(x[:, : i + 1] * self.scale[i] + 1.0).sum(dim=1) for i in range(self.branches)]
        return torch.stack(outs, dim=1)


def build(branches: int = 200) -> nn.Module:
    return Wide(branches)
