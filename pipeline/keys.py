"""Stage keys as lists of named parts.

A key is the digest of its named parts: the stage name, a digest of the stage's own source
files, each declared config field, each declared environment fact, the digest of each input
artifact, and any dynamic parts the stage computes (trace: the model's source files). Each
part is recorded with the build, so `kiln explain` can name the part that changed.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, cast

from cache.hashing import digest_file, digest_json, digest_tree
from cache.records import Records
from pipeline.config import PROJECT_ROOT, ModelConfig
from pipeline.envfacts import env_fact
from pipeline.stages import Stage

Parts = dict[str, str]


@dataclass(frozen=True)
class KeyContext:
    """What a stage's dynamic key function may look at (torch-free, cheap)."""

    config: ModelConfig
    records: Records
    build_id: str
    live: Any = None


class DynamicKeys(Protocol):
    def key_parts(self, ctx: KeyContext) -> Parts: ...

    def remember(self, ctx: KeyContext, notes: Mapping[str, Any]) -> None: ...


def key_of(parts: Mapping[str, str]) -> str:
    return digest_json(sorted(parts.items()))


@functools.cache
def source_digest(sources: tuple[str, ...], root: Path = PROJECT_ROOT) -> str:
    digests = []
    for rel in sources:
        path = root / rel
        digest = digest_tree(path) if path.is_dir() else digest_file(path)
        digests.append([rel, digest])
    return digest_json(digests)


def dynamic_keys(stage: Stage) -> DynamicKeys | None:
    if stage.keys is None:
        return None
    module: ModuleType = importlib.import_module(stage.keys)
    return cast(DynamicKeys, module)


def static_parts(
    stage: Stage, config: ModelConfig, target: str, inputs: Mapping[str, str]
) -> Parts:
    """The parts every stage has; `inputs` maps "stage/artifact" to its digest."""
    parts: Parts = {"stage": stage.name, "source": source_digest(stage.sources)[:16]}
    for name in stage.config:
        parts[f"config.{name}"] = digest_json(config.field(name))[:16]
    for fact in stage.env:
        parts[f"env.{fact}"] = env_fact(fact, target)
    for ref in stage.reads:
        parts[f"input.{ref}"] = inputs[ref][:16]
    return parts


def diff_parts(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    """Human lines naming each part that differs between two keys."""
    lines = []
    for name in sorted(set(old) | set(new)):
        before, after = old.get(name), new.get(name)
        if before == after:
            continue
        if before is None:
            lines.append(f"part {name} is new")
        elif after is None:
            lines.append(f"part {name} is gone")
        elif name.startswith("env."):
            lines.append(f"part {name} changed: {before} -> {after}")
        else:
            lines.append(f"part {name} changed")
    return lines
