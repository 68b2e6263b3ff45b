"""torchvision models (random init: weights=None)."""

from __future__ import annotations

from torch import nn


def resnet18(classes: int = 1000) -> nn.Module:
    from torchvision.models import resnet18 as make

    return make(weights=None, num_classes=classes)  # type: ignore[no-any-return]
