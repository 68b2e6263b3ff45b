"""Weights in and out: checkpoints loaded with clear mismatch errors, and the weights file
(safetensors) written beside the program."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import torch
import xxhash
from safetensors.torch import load_file, save_file

from contract.errors import KilnError

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
        raise KilnError(f"model {model!r}: {path.name} is not a readable checkpoint: {_gist(err)}",
                        "a checkpoint is a .safetensors file or a torch.save'd state_dict") from err
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise KilnError(f"model {model!r}: checkpoint {path.name} is not a state_dict of tensors")
    return state


_GIST_CHARS = 120


# Note: torch's weights_only refusal leads with advice to retry with weights_only=False, which runs
# whatever code the file holds: only the unpickler's complaint after it is shown, never the advice.
def _gist(err: Exception) -> str:
    """The first sentence of why a checkpoint did not load, cut to _GIST_CHARS."""
    text = str(err)
    _, refused, complaint = text.partition("WeightsUnpickler error:")
    lines = [line.strip() for line in (complaint if refused else text).splitlines() if line.strip()]
    first = lines[0].split(". ")[0].rstrip(".") if lines else ""
    if not first or "weights_only" in first:
        return type(err).__name__
    return first if len(first) <= _GIST_CHARS else first[: _GIST_CHARS - 3] + "..."


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
    save_file(out, str(path), metadata={DIGEST_KEY: "0" * DIGEST_CHARS})
    seal_weights(path)


DIGEST_KEY = "kiln.xxh3_128"  # kiln_verify.h's kDigestKey
DIGEST_CHARS = 32
_PLACEHOLDER = re.compile(rb'"kiln\.xxh3_128"\s*:\s*"(0{32})"')


def seal_weights(path: Path) -> str:
    """Write the file's own digest into its placeholder: the xxh3-128 of the whole file as it
    reads with the placeholder's 32 '0's (runtime/kiln_verify.h checks it the same way)."""
    with open(path, "r+b") as f:
        header_len = int.from_bytes(f.read(8), "little")
        found = _PLACEHOLDER.search(f.read(header_len))
        if found is None:
            raise ValueError(f"{path}: no {DIGEST_KEY} placeholder in the header")
        f.seek(0)
        digest = xxhash.xxh3_128()
        while chunk := f.read(1 << 24):
            digest.update(chunk)
        text = digest.hexdigest()
        f.seek(8 + found.start(1))
        f.write(text.encode())
    return text


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
