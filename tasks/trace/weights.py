"""Weights in and out: checkpoints loaded with clear mismatch errors, and the weights file
(safetensors) written beside the program."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from pipeline.errors import KilnError

_SHOW = 5


def read_checkpoint(path: Path, model: str) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise KilnError(f"model {model!r}: checkpoint {path} does not exist",
                        "fix weights.checkpoint in the config (relative to the config file)")
    try:
        if path.suffix == ".safetensors":
            return dict(load_file(str(path)))
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise KilnError(f"model {model!r}: cannot read checkpoint {path.name}: {err}",
                        "a checkpoint is a .safetensors file or a torch.save'd state_dict") from err
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise KilnError(f"model {model!r}: checkpoint {path.name} is not a state_dict of tensors")
    return state


def load_checkpoint(module: torch.nn.Module, path: Path, model: str) -> None:
    state = read_checkpoint(path, model)
    expected = module.state_dict()
    problems = _mismatches(expected, state)
    if problems:
        raise KilnError(
            f"model {model!r}: checkpoint {path.name} does not match the model:\n    "
            + "\n    ".join(problems),
            "use a checkpoint saved from this architecture, or fix model.kwargs",
        )
    cast = {k: v.to(expected[k].dtype) for k, v in state.items()}
    module.load_state_dict(cast, strict=True)


def _mismatches(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> list[str]:
    missing = sorted(set(expected) - set(got))
    unexpected = sorted(set(got) - set(expected))
    shapes = [
        f"{k}: checkpoint {tuple(got[k].shape)}, model {tuple(expected[k].shape)}"
        for k in sorted(set(expected) & set(got))
        if got[k].shape != expected[k].shape
    ]
    lines = []
    if missing:
        lines.append(f"missing {len(missing)}: {', '.join(missing[:_SHOW])}")
    if unexpected:
        lines.append(f"unexpected {len(unexpected)}: {', '.join(unexpected[:_SHOW])}")
    lines.extend(f"shape {s}" for s in shapes[:_SHOW])
    return lines


def write_weights(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Save as safetensors. Tied weights (one storage, two names) are written once per name:
    safetensors refuses shared storage, and later stages look tensors up by name."""
    seen: set[int] = set()
    out = {}
    for name in sorted(tensors):
        t = tensors[name].detach()
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.contiguous().clone() if ptr in seen else t.contiguous()
        seen.add(ptr)
    save_file(out, str(path))
