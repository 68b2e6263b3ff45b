"""The weights stage's dynamic key parts: the checkpoint's bytes (its digest), computed without
importing torch; an in-memory module's weights are keyed by the file they make."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contract.keys import KeyContext, Parts
from tasks.trace.keys import file_digest


def key_parts(ctx: KeyContext) -> Parts | None:
    if ctx.live is not None:
        return None  # the module's tensors, which only the file they make can key
    checkpoint = ctx.config.checkpoint
    return {} if checkpoint is None else {"checkpoint": file_digest(checkpoint, ctx.records)[:16]}


def remember(ctx: KeyContext, notes: Mapping[str, Any]) -> None:
    """Nothing to remember: the key is known before the stage runs."""
