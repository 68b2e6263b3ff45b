"""Models with data-dependent control flow: torch.cond and torch.while_loop, each with
reductions inside, so kiln must tune kernels the example inputs never reach."""

from __future__ import annotations

import torch
from torch import nn


class CondModel(nn.Module):
    """Branch on a data-dependent sum exceeding `threshold`; each branch reduces differently.
    With a large threshold, random example inputs never take the first branch."""

    def __init__(self, features: int, threshold: float = 0.0) -> None:
        super().__init__()
        self.proj = nn.Linear(features, features)
        self.threshold = threshold

    def predicate(self, x: torch.Tensor) -> torch.Tensor:
        taken: torch.Tensor = self.proj(x).sum() > self.threshold
        return taken

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)

        def positive(h: torch.Tensor) -> torch.Tensor:
            return torch.softmax(h, dim=-1) * h.amax(dim=-1, keepdim=True)

        def negative(h: torch.Tensor) -> torch.Tensor:
            return h - h.mean(dim=-1, keepdim=True) / (h.var(dim=-1, keepdim=True) + 1e-5)

        out: torch.Tensor = torch.cond(h.sum() > self.threshold, positive, negative, (h,))
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


def build_cond(features: int = 32, threshold: float = 0.0) -> CondModel:
    return CondModel(features, threshold)


def build_while(features: int = 32, steps: int = 8) -> WhileModel:
    return WhileModel(features, steps)


class NestedModel(nn.Module):
    """A while_loop whose body holds a cond whose else branch holds a while_loop, carrying
    tensors of several shapes and dtypes (an int64 counter, the float32 state, a float64 row
    sum, a bool row flag), stopping on a data-dependent condition or after `steps`."""

    def __init__(self, features: int, steps: int) -> None:
        super().__init__()
        self.proj = nn.Linear(features, features)
        self.steps = steps

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = self.proj(x)
        limit = self.steps
        loop = torch._higher_order_ops.while_loop

        def smooth(h: torch.Tensor) -> torch.Tensor:
            def more(j: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
                return j < 2

            def step(j: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                return j + 1, g * 0.5 + g.mean(dim=-1, keepdim=True)

            _, g = loop(more, step, (h.new_zeros((), dtype=torch.int64), h))  # type: ignore[no-untyped-call]
            result: torch.Tensor = g
            return result

        def sharpen(h: torch.Tensor) -> torch.Tensor:
            return torch.softmax(h, dim=-1) * 2.0

        def cond_fn(i: torch.Tensor, h: torch.Tensor, total: torch.Tensor,
                    seen: torch.Tensor) -> torch.Tensor:
            return (i < limit) & (h.abs().amax() > 0.05)

        def body_fn(i: torch.Tensor, h: torch.Tensor, total: torch.Tensor,
                    seen: torch.Tensor) -> tuple[torch.Tensor, ...]:
            nxt: torch.Tensor = torch.cond(h.sum() > 0, sharpen, smooth, (h,))
            return i + 1, nxt * 0.9, total + nxt.double().sum(dim=-1), seen | (nxt > 0.5).any(dim=-1)

        rows = x.shape[0]
        start = (h.new_zeros((), dtype=torch.int64), h, h.new_zeros(rows, dtype=torch.float64),
                 h.new_zeros(rows, dtype=torch.bool))
        steps, out, total, seen = loop(cond_fn, body_fn, start)  # type: ignore[no-untyped-call]
        return out, total, seen, steps


def build_nested(features: int = 32, steps: int = 6) -> NestedModel:
    return NestedModel(features, steps)
