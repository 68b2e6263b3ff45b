"""What the weights file must hold, written by trace beside the program (weights.json), and
where each tensor's values come from.

A tensor of the program comes from one of three places:
- "state": the module's state (a parameter or a persistent buffer): a checkpoint gives it, or
  the seeded init when there is no checkpoint;
- "init": a non-persistent buffer or a tensor attribute of a module, which no checkpoint holds:
  the seeded init gives it;
- "traced": a constant the forward made while it was exported (torch.tensor([...]) in the
  code): its value is known to trace alone, which writes it to constants.safetensors.

The manifest also lists the module's whole state (tied names included), which a checkpoint
must match by name, shape and dtype, and which names of it are one tensor (tied weights).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from cache.hashing import canonical_json
from contract.errors import KilnError

MANIFEST = "weights.json"
CONSTANTS = "constants.safetensors"
SOURCES = ("state", "init", "traced")


def _spec(t: torch.Tensor) -> dict[str, Any]:
    return {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}


def attribute(module: torch.nn.Module, name: str) -> Any:
    """The object at a dotted attribute path of a module, or None."""
    value: Any = module
    for part in name.split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value


def manifest(program_tensors: dict[str, torch.Tensor], module: torch.nn.Module) -> dict[str, Any]:
    """weights.json's content: the program's tensors with their source, and the module's state."""
    state = module.state_dict(keep_vars=True)
    tensors = {}
    for name in sorted(program_tensors):
        found = attribute(module, name)
        if name in state:
            source = "state"
        elif isinstance(found, torch.nn.Parameter):
            raise KilnError(f"parameter {name!r} is left out of the model's state_dict, so no checkpoint "
                            "can hold it and kiln cannot tell where its values come from",
                            "keep every parameter in state_dict (a buffer can be persistent=False)")
        elif isinstance(found, torch.Tensor):
            source = "init"
        else:
            source = "traced"
        tensors[name] = {**_spec(program_tensors[name]), "from": source}
    return {"tensors": tensors, "state": {k: _spec(v) for k, v in sorted(state.items())},
            "tied": _tied(state)}


def _tied(state: dict[str, torch.Tensor]) -> list[list[str]]:
    """Names of the state that are one tensor (tied weights), each group in state_dict order."""
    groups: dict[int, list[str]] = {}
    for name, t in state.items():
        groups.setdefault(id(t), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def traced_constants(program_tensors: dict[str, torch.Tensor],
                     made: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The constants trace itself must write (their values exist nowhere else)."""
    return {name: program_tensors[name] for name in names_from(made, "traced")}


def write_manifest(made: dict[str, Any], path: Path) -> None:
    path.write_bytes(canonical_json(made))


def read_manifest(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def names_from(made: dict[str, Any], source: str) -> list[str]:
    return [name for name, entry in made["tensors"].items() if entry["from"] == source]


def state_specs(made: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    return {name: (tuple(e["shape"]), getattr(torch, e["dtype"])) for name, e in made["state"].items()}
