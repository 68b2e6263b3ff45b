"""Weights in and out: checkpoints read with clear mismatch errors, and the weights file
(safetensors, sealed with its own digest) written."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import xxhash
from safetensors.torch import load_file

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


Spec = tuple[tuple[int, ...], torch.dtype]  # a tensor's shape and dtype


def load_checkpoint(module: torch.nn.Module, path: Path, model: str) -> None:
    """The checkpoint read into a built module (the eager reference's way)."""
    expected = module.state_dict()
    state = checked_checkpoint(path, model, {k: (tuple(v.shape), v.dtype) for k, v in expected.items()})
    module.load_state_dict(state, strict=True)


def checked_checkpoint(path: Path, model: str, expected: dict[str, Spec]) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors, checked against the model's state (names, shapes, dtypes) and
    cast to its float dtypes; a clear error naming the tensors that do not match."""
    state = read_checkpoint(path, model)
    problems = _mismatches(expected, state)
    if problems:
        raise KilnError(
            f"model {model!r}: checkpoint {path.name} does not match the model:\n    "
            + "\n    ".join(problems),
            "use a checkpoint saved from this architecture, or fix model.kwargs",
        )
    return {k: v if v.dtype == expected[k][1] else v.to(expected[k][1]) for k, v in state.items()}


# Note: a tensor of another width of the same kind (an fp32 checkpoint for an fp16 model.dtype,
# a uint8 mask for a bool buffer) is cast, as load_state_dict casts it; a change of kind (float
# for int) is a checkpoint of another model, and named.
def _castable(got: torch.dtype, want: torch.dtype) -> bool:
    return got == want or got.is_floating_point == want.is_floating_point


def _mismatches(expected: dict[str, Spec], got: dict[str, torch.Tensor]) -> list[str]:
    missing = sorted(set(expected) - set(got))
    unexpected = sorted(set(got) - set(expected))
    both = sorted(set(expected) & set(got))
    shapes = [f"{k}: checkpoint {tuple(got[k].shape)}, model {expected[k][0]}"
              for k in both if tuple(got[k].shape) != expected[k][0]]
    dtypes = [f"{k}: checkpoint {_name(got[k].dtype)}, model {_name(expected[k][1])}"
              for k in both if not _castable(got[k].dtype, expected[k][1])]
    lines = []
    if missing:
        lines.append(f"missing {len(missing)}: {', '.join(missing[:_SHOW])}")
    if unexpected:
        lines.append(f"unexpected {len(unexpected)}: {', '.join(unexpected[:_SHOW])}")
    lines.extend(f"shape {s}" for s in shapes[:_SHOW])
    lines.extend(f"dtype {s}" for s in dtypes[:_SHOW])
    return lines


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


_SAFETENSORS_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.complex64: "C64", torch.uint16: "U16", torch.uint32: "U32",
    torch.uint64: "U64", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}


# Note: safetensors' own save_file turns every tensor into a bytes object before it writes, which
# holds a model's weights twice (bert: 1.0 GB of peak for 0.5 GB of weights). The format is a
# length, a JSON header and the tensors' bytes, so it is written here straight from each
# tensor's memory. As safetensors orders them, larger elements come first (each tensor stays
# aligned to its element size), then by name; tied weights are written once per name. The seal
# is digested from the bytes as they are written, so the file is never read back.
def write_weights(tensors: dict[str, torch.Tensor], path: Path,
                  after: Callable[[torch.Tensor], None] | None = None) -> None:
    """Save as safetensors, sealed with the file's own digest: the xxh3-128 of the whole file as
    it reads with the placeholder's 32 '0's, written into the placeholder (runtime/kiln_verify.h
    checks it the same way). `after` is called with each tensor once its bytes are written (a
    Spill hands its pages back)."""
    order = sorted(tensors, key=lambda name: (-tensors[name].element_size(), name))
    text = _header(tensors, order)
    digest = xxhash.xxh3_128()
    with open(path, "wb") as f:
        for chunk in (len(text).to_bytes(8, "little"), text):
            f.write(chunk)
            digest.update(chunk)
        for name in order:
            data = tensors[name].detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data
            f.write(data)
            digest.update(data)
            if after is not None:
                after(tensors[name])
        found = _PLACEHOLDER.search(text)
        assert found is not None
        f.seek(8 + found.start(1))
        f.write(digest.hexdigest().encode())


def _header(tensors: dict[str, torch.Tensor], order: list[str]) -> bytes:
    """The safetensors header, padded to 8 bytes, with the seal's placeholder."""
    header: dict[str, Any] = {"__metadata__": {DIGEST_KEY: "0" * DIGEST_CHARS}}
    offset = 0
    for name in order:
        t = tensors[name]
        size = t.numel() * t.element_size()
        if t.dtype not in _SAFETENSORS_DTYPES:
            raise KilnError(f"tensor {name!r} is {_name(t.dtype)}, which kiln's weights file cannot hold",
                            f"use one of {', '.join(sorted(_name(d) for d in _SAFETENSORS_DTYPES))}")
        header[name] = {"dtype": _SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    return text + b" " * (-len(text) % 8)


DIGEST_KEY = "kiln.xxh3_128"  # kiln_verify.h's kDigestKey
DIGEST_CHARS = 32
_PLACEHOLDER = re.compile(rb'"kiln\.xxh3_128"\s*:\s*"(0{32})"')
