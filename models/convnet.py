"""A small CNN of our own: convolutions, batch norm (eval), pooling and a linear head."""

from __future__ import annotations

import torch
from torch import nn


class ConvNet(nn.Module):
    def __init__(self, channels: int, width: int, classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, width * 2, 3, padding=1),
            nn.BatchNorm2d(width * 2),
            nn.SiLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(width * 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(torch.flatten(self.features(x), 1))
        return out


def build(channels: int = 3, width: int = 16, classes: int = 10) -> ConvNet:
    return ConvNet(channels, width, classes)
