"""The model built without its weights: constructed on the meta device, its parameters and
buffers then made fake tensors on the CPU, so torch.export traces it as it would the real one
without init or memory.

Note: a module built on the meta device alone would not export: a forward that makes a tensor
without naming a device (torch.arange(n)) makes a CPU tensor, and meta and CPU tensors do not
mix. Fake tensors carry the CPU device and no storage. The program exported so is byte for
byte the one the real module gives (tests/test_weights_stage.py checks it); where the model
cannot be built or exported that way (an __init__ that reads a tensor's value, as timm's
drop-path schedule does), trace builds it for real and says so in its notes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from tasks.trace.factory import build_model


def build_fake(config: dict[str, Any], model: str, root: Any) -> tuple[torch.nn.Module, FakeTensorMode]:
    """The config's module with fake parameters and buffers, and the fake mode they belong to."""
    with torch.device("meta"):
        module = build_model(config, model, root)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    made: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # meta tensor's id -> (it, its fake)

    def fake(t: torch.Tensor, parameter: bool) -> torch.Tensor:
        # Note: tied weights are one Parameter under two names; they stay one fake. The meta
        # tensor is held beside its fake, so its id is not reused while this runs.
        if id(t) not in made:
            value = FakeTensor(mode, t.data if parameter else t, torch.device("cpu"))
            made[id(t)] = (t, torch.nn.Parameter(value, t.requires_grad) if parameter else value)
        return made[id(t)][1]

    for sub in module.modules():
        for name, p in sub._parameters.items():
            if p is not None:
                sub._parameters[name] = fake(p, parameter=True)  # type: ignore[assignment]
        for name, b in sub._buffers.items():
            if b is not None:
                sub._buffers[name] = fake(b, parameter=False)
        for name, value in list(vars(sub).items()):
            if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor) and value.is_meta:
                setattr(sub, name, fake(value, parameter=False))
    return module, mode


def fake_inputs(mode: FakeTensorMode, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
