"""The cpu target's tuning.json, typed: per kernel, the variant autotune chose, its config and
the digest of its compiled object (autotune's objects/<key16>.o, which link links in)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CpuDecision:
    variant: str
    config: Mapping[str, Any]  # parallel, simd, split_r
    object: str  # digest_file of objects/<key16>.o

    def to_json(self) -> dict[str, Any]:
        return {"variant": self.variant, "config": dict(self.config), "object": self.object}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CpuDecision:
        return cls(str(data["variant"]), dict(data["config"]), str(data["object"]))


def tuning_json(decisions: Mapping[str, CpuDecision]) -> dict[str, Any]:
    return {key: decision.to_json() for key, decision in sorted(decisions.items())}
