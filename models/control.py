"""Models with data-dependent control flow: torch.cond and torch.while_loop, each with
reductions inside, so kiln must tune kernels the example inputs never reach."""

from __future__ import annotations

import torch
from torch import nn


class CondModel(nn.Module):
    """Branch on the sign of a data-dependent sum; each branch reduces differently."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.proj = nn.Linear(features, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)

        def positive(h: torch.Tensor) -> torch.Tensor:
            return torch.softmax(h, dim=-1) * h.amax(dim=-1, keepdim=True)

        def negative(h: torch.Tensor) -> torch.Tensor:
            return h - h.mean(dim=-1, keepdim=True) / (h.var(dim=-1, keepdim=True) + 1e-5)

        out: torch.Tensor = torch.cond(h.sum() > 0, positive, negative, (h,))
        return out


class WhileModel(nn.Module):
    """Repeat a normalizing update until the norm falls under a bound or `steps` is reached."""

    def __init__(self, features: int, steps: int) -> None:
        super().__init__()
        self.proj = nn.Linear(features, features)
        self.steps = steps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        limit = self.steps

        def cond_fn(i: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
            return (i < limit) & (h.abs().sum() > 1.0)

        def body_fn(i: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            scale = h.pow(2).sum(dim=-1, keepdim=True).sqrt() + 1.0
            return i + 1, h / scale * 0.5

        loop = torch._higher_order_ops.while_loop
        _, out = loop(cond_fn, body_fn, (torch.tensor(0), h))  # type: ignore[no-untyped-call]
        result: torch.Tensor = out
        return result


def build_cond(features: int = 32) -> CondModel:
    return CondModel(features)


def build_while(features: int = 32, steps: int = 8) -> WhileModel:
    return WhileModel(features, steps)
