"""Stage keys as lists of named parts.

A key is the digest of its named parts: the stage name, each file of kiln's code the stage
runs (`code:<file>`, pipeline/codedeps.py), each declared config field, each declared
environment fact, the digest of each input artifact, and any dynamic parts the stage computes
(trace: the model's source files). Each part is recorded with the build, so `kiln explain` can
name the part that changed.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import cast

from cache.hashing import digest_json
from cache.store import Artifact
from contract.config import ModelConfig
from contract.facts import env_fact
from contract.keys import DynamicKeys, Parts
from pipeline.codedeps import ScanStore, code_parts
from pipeline.stages import Stage


def key_of(parts: Mapping[str, str]) -> str:
    return digest_json(sorted(parts.items()))


def dynamic_keys(stage: Stage) -> DynamicKeys | None:
    if stage.keys is None:
        return None
    module: ModuleType = importlib.import_module(stage.keys)  # codedeps: key code, not stage code
    return cast(DynamicKeys, module)


def static_parts(
    stage: Stage, config: ModelConfig, target: str, inputs: Mapping[str, str], scans: ScanStore | None = None,
    executor: Mapping[str, str] | None = None,
) -> Parts:
    """The parts every stage has; `inputs` maps "stage/artifact" to its digest. `scans` keeps
    the import scans of kiln's files between processes (pipeline.codedeps); `executor` is where
    per-kernel work runs (it names the tuning GPU of a cluster's nodes)."""
    parts: Parts = {"stage": stage.name}
    if stage.by_target:
        parts["target"] = target
    entry = stage.entry_for(target)
    if entry is not None:
        parts.update(code_parts(entry, store=scans))
    for name in stage.config:
        parts[f"config.{name}"] = digest_json(config.field(name))[:16]
    for fact in stage.env:
        parts[f"env.{fact}"] = env_fact(fact, target, executor)
    for ref in stage.reads:
        parts[f"input.{ref}"] = inputs[ref][:16]
    return parts


def output_parts(artifacts: Mapping[str, Artifact]) -> Parts:
    """`output:<file>` -> digest of each file a stage wrote: the key of a stage that is known
    only by its output (content addressing, as git names a blob)."""
    return {f"output:{name}": a.digest[:16] for name, a in sorted(artifacts.items())}


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
