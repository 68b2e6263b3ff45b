"""Tracing an in-memory module (pipeline.compile): its key comes from the source files of
its module classes, its weights' bytes and its example inputs' shapes and dtypes."""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cache.hashing import digest_file
from pipeline.keys import Parts


@dataclass(frozen=True)
class LiveModel:
    module: torch.nn.Module
    args: tuple[Any, ...]


def live_key_parts(live: LiveModel) -> Parts:
    parts: Parts = {}
    for cls in sorted({type(m) for m in live.module.modules()}, key=lambda c: c.__qualname__):
        try:
            file = inspect.getsourcefile(cls)
        except TypeError:
            file = None
        if file and "site-packages" not in file:
            parts[f"src:{file}"] = digest_file(Path(file))[:16]
    parts["weights"] = _state_digest(live.module)
    parts["inputs"] = hashlib.sha256(
        repr([(tuple(a.shape), str(a.dtype)) for a in live.args]).encode()
    ).hexdigest()[:16]
    return parts


def _state_digest(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]
