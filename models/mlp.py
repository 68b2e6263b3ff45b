"""A plain MLP; `layers` is the knob a one-layer edit turns."""

from __future__ import annotations

import itertools

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, features: int, hidden: int, layers: int, classes: int) -> None:
        super().__init__()
        widths = [features] + [hidden] * layers
        self.blocks = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.nn.functional.gelu(block(x))
        return torch.softmax(self.head(self.norm(x)), dim=-1)


def build(features: int = 64, hidden: int = 128, layers: int = 4, classes: int = 10) -> MLP:
    return MLP(features, hidden, layers, classes)
