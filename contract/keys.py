"""The protocol of a stage whose key has parts beyond its declaration (trace: the model's
source files). The engine builds the declared parts (pipeline/keys.py) and asks the stage's
`keys` module for the rest."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cache.records import Records
from contract.config import ModelConfig

Parts = dict[str, str]


@dataclass(frozen=True)
class KeyContext:
    """What a stage's dynamic key function may look at (torch-free, cheap)."""

    config: ModelConfig
    records: Records
    build_id: str
    live: Any = None


class DynamicKeys(Protocol):
    """A stage's parts beyond its declaration. key_parts returns None when the key can be known
    only by running the stage (an in-memory module: only tracing it says what it computes);
    the stage then always runs and is keyed by what it wrote (output_parts)."""

    def key_parts(self, ctx: KeyContext) -> Parts | None: ...

    def remember(self, ctx: KeyContext, notes: Mapping[str, Any]) -> None: ...
