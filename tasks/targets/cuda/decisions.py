"""The cuda target's tuning.json, typed: per kernel, the variant and config autotune chose, the
digest of its cubin and the launch facts the wrapper needs (tune.py's save_cubin writes them).
Same bytes as the JSON: to_json gives back what from_json read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LaunchFacts:
    name: str  # the kernel's symbol in its cubin
    num_warps: int
    shared: int  # bytes of dynamic shared memory
    folded: tuple[str, ...] = ()  # arguments compiled into the cubin as constants: not passed
    global_scratch_size: int = 0  # Triton scratch memory, which kiln's launcher does not provide
    profile_scratch_size: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "num_warps": self.num_warps, "shared": self.shared,
                "folded": list(self.folded), "global_scratch_size": self.global_scratch_size,
                "profile_scratch_size": self.profile_scratch_size}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LaunchFacts:
        return cls(str(data["name"]), int(data["num_warps"]), int(data["shared"]),
                   tuple(str(a) for a in data.get("folded", ())), int(data.get("global_scratch_size", 0)),
                   int(data.get("profile_scratch_size", 0)))


@dataclass(frozen=True)
class CudaDecision:
    variant: str
    function: str  # the variant's function in the kernel's module
    config: Mapping[str, int]  # XBLOCK, RBLOCK, num_warps, num_stages
    tuned: bool  # False: the default candidate, compiled without a GPU to time it on
    cubin: str  # digest_file of cubins/<key16>.cubin; "" where nothing is launched
    # None where nothing is launched: a matmul pair whose library calls won (variant "library")
    launch: LaunchFacts | None

    def to_json(self) -> dict[str, Any]:
        return {"variant": self.variant, "function": self.function, "config": dict(self.config),
                "tuned": self.tuned, "cubin": self.cubin,
                "launch": None if self.launch is None else self.launch.to_json()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CudaDecision:
        config = {name: int(value) for name, value in data["config"].items()}
        launch = None if data["launch"] is None else LaunchFacts.from_json(data["launch"])
        return cls(str(data["variant"]), str(data["function"]), config, bool(data["tuned"]),
                   str(data["cubin"]), launch)

    def facts(self) -> LaunchFacts:
        """The launch facts of a decision that launches a kernel."""
        if self.launch is None:
            raise ValueError(f"the {self.variant} decision launches no kernel")
        return self.launch


def read_tuning(data: Mapping[str, Any]) -> dict[str, CudaDecision]:
    """tuning.json's data: kernel key -> decision."""
    return {key: CudaDecision.from_json(decision) for key, decision in data.items()}


def tuning_json(decisions: Mapping[str, CudaDecision]) -> dict[str, Any]:
    return {key: decision.to_json() for key, decision in sorted(decisions.items())}
