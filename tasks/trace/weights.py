"""Weights in and out: checkpoints loaded with clear mismatch errors, and the weights file
(safetensors) written beside the program."""

from __future__ import annotations

import threading
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


# Note: writing bert's 508 MB of weights takes seconds, mostly disk; torch.export's weights are
# final before its decompositions run, so the file is written on a thread meanwhile (file writes
# release the GIL). The decomposed program's weights are checked against what was written: should
# a decomposition ever lift a new constant, the file is written again, whole, from those.
class WeightsWriter:
    """write_weights(tensors, path) on a thread, for the length of a with block."""

    def __init__(self, tensors: dict[str, torch.Tensor], path: Path) -> None:
        self.tensors, self.path = tensors, path
        self.final: dict[str, torch.Tensor] | None = None
        self.failed: BaseException | None = None
        self.thread = threading.Thread(target=self._write, name="write-weights", daemon=True)

    def _write(self) -> None:
        try:
            write_weights(self.tensors, self.path)
        except BaseException as err:  # raised again on the caller's thread
            self.failed = err

    def expect(self, final: dict[str, torch.Tensor]) -> None:
        """The weights the file must hold: the program's after every change to it."""
        self.final = final

    def __enter__(self) -> WeightsWriter:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join()
        if exc[0] is not None:
            return
        if self.failed is not None:
            raise self.failed
        if self.final is not None and not _same_tensors(self.final, self.tensors):
            write_weights(self.final, self.path)


def _same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[k] is b[k] or (a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
                         and a[k].stride() == b[k].stride() and a[k].data_ptr() == b[k].data_ptr())
        for k in a)
