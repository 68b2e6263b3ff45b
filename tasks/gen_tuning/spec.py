"""kernels.json, typed: what both targets' entries share (a kernel's key, the kernels that share
it, where they come from and sit, and its parameters). Each target's spec module
(tasks/targets/*/spec.py) adds its variants and how to build or launch them.

The tuners (tasks/targets/*/tune.py) are copied into the build and run without kiln, so they
read the plain JSON; the stages read and write it through these types. pretty_json sorts keys,
so from_json(to_json()) is the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tasks.codegen.inputs import index_bounds
from tasks.ir.nodes import Buffer
from tasks.ir.serialize import buffer_from, buffer_json
from tasks.schedule.model import Kernel


@dataclass(frozen=True)
class KernelParam:
    spec: Buffer
    role: str  # in, out or inout
    bound: int | None  # an integer parameter used as an index: its values lie in [0, bound)

    def to_json(self) -> dict[str, Any]:
        return buffer_json(self.spec) | {"role": self.role, "bound": self.bound}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KernelParam:
        bound = data.get("bound")
        return cls(buffer_from(dict(data)), str(data["role"]), None if bound is None else int(bound))


def kernel_params(k: Kernel) -> tuple[KernelParam, ...]:
    bounds = index_bounds(k)
    return tuple(KernelParam(p.spec, p.role, bounds.get(p.name)) for p in k.params)


@dataclass(frozen=True)
class KernelHead:
    """The fields every target's kernels.json entry has."""

    key: str
    names: tuple[str, ...]  # every kernel of the schedule with this key, in order
    origins: tuple[str, ...]  # the torch ops it came from
    places: tuple[str, ...]  # the graphs its launches sit in (main, a cond branch, a loop body)
    params: tuple[KernelParam, ...]

    def head_json(self) -> dict[str, Any]:
        return {"key": self.key, "names": list(self.names), "origins": list(self.origins),
                "places": list(self.places), "params": [p.to_json() for p in self.params]}

    @staticmethod
    def head_from(data: Mapping[str, Any]) -> dict[str, Any]:
        """The shared fields of an entry, as keyword arguments for a target's entry type."""
        return {"key": str(data["key"]), "names": tuple(map(str, data["names"])),
                "origins": tuple(map(str, data["origins"])), "places": tuple(map(str, data["places"])),
                "params": tuple(KernelParam.from_json(p) for p in data["params"])}


class Variant(Protocol):
    @property
    def name(self) -> str: ...


class Entry(Protocol):
    @property
    def variants(self) -> Sequence[Variant]: ...


class KernelsSpec(Protocol):
    """A target's kernels.json, as gen-tuning-code's summary needs it."""

    @property
    def kernels(self) -> Sequence[Entry]: ...
