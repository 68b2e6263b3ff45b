"""The cpu target's kernels.json, typed: per distinct kernel, its C++ variants (a file each) and
their configs, the function every variant defines, and the compiler command tune.py builds with."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tasks.gen_tuning.spec import KernelHead


@dataclass(frozen=True)
class CpuVariantFile:
    name: str
    file: str  # under the spec's folder
    config: Mapping[str, int | bool]  # parallel (levels), simd, split_r

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "file": self.file, "config": dict(self.config)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CpuVariantFile:
        return cls(str(data["name"]), str(data["file"]), dict(data["config"]))


@dataclass(frozen=True)
class CpuKernelEntry(KernelHead):
    function: str  # the symbol every variant defines
    variants: tuple[CpuVariantFile, ...]  # the default first

    def to_json(self) -> dict[str, Any]:
        variants = [v.to_json() for v in self.variants]
        return self.head_json() | {"function": self.function, "variants": variants}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CpuKernelEntry:
        return cls(**cls.head_from(data), function=str(data["function"]),
                   variants=tuple(CpuVariantFile.from_json(v) for v in data["variants"]))


@dataclass(frozen=True)
class CpuKernelsJson:
    folder: str  # the variants' sources, beside kernels.json
    compiler: tuple[str, ...]  # the compiler's name (tune.py finds it on PATH) and its flags
    kernels: tuple[CpuKernelEntry, ...]

    def to_json(self) -> dict[str, Any]:
        return {"target": "cpu", "folder": self.folder, "compiler": list(self.compiler),
                "kernels": [k.to_json() for k in self.kernels]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CpuKernelsJson:
        return cls(str(data["folder"]), tuple(map(str, data["compiler"])),
                   tuple(CpuKernelEntry.from_json(k) for k in data["kernels"]))
