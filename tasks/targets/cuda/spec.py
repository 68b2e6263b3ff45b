"""The cuda target's kernels.json, typed: per distinct kernel, its Triton module, the variants in
it with their candidate configs, and what tune.py needs to launch any of them on random inputs
(the signature, xnumel and rnumel)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contract.timings import LIBRARY
from tasks.gen_tuning.spec import KernelHead


@dataclass(frozen=True)
class TritonVariantEntry:
    name: str  # persistent, looped, tiled, pointwise, ...
    function: str  # its function in the kernel's module
    configs: tuple[Mapping[str, int], ...]  # candidate launch configs, the default first
    tile: tuple[int, int]  # the (rows, columns) its programs cover

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "function": self.function, "configs": [dict(c) for c in self.configs],
                "tile": list(self.tile)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TritonVariantEntry:
        rows, cols = (int(n) for n in data["tile"])
        return cls(str(data["name"]), str(data["function"]),
                   tuple({k: int(v) for k, v in c.items()} for c in data["configs"]), (rows, cols))



@dataclass(frozen=True)
class MatmulFacts:
    op: str  # mm, bmm, addmm, baddbmm
    alpha: float
    beta: float
    sizes: tuple[int, int, int, int]  # batch, M, N, K
    epilogue: str  # the key of the epilogue kernel's own entry
    product: int  # which of the epilogue's parameters is the product
    unaligned: tuple[str, ...]  # parameters not on 16 bytes (views at an offset): not compiled as aligned

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "alpha": self.alpha, "beta": self.beta, "sizes": list(self.sizes),
                "epilogue": self.epilogue, "product": self.product, "unaligned": list(self.unaligned)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MatmulFacts:
        batch, rows, cols, depth = (int(n) for n in data["sizes"])
        return cls(str(data["op"]), float(data["alpha"]), float(data["beta"]), (batch, rows, cols, depth),
                   str(data["epilogue"]), int(data["product"]), tuple(map(str, data["unaligned"])))


@dataclass(frozen=True)
class CudaKernelEntry(KernelHead):
    kernel: str  # the kernel's name, which its functions start with
    file: str  # its module, under the spec's folder
    signature: Mapping[str, str]  # argument -> Triton type (JSON sorts it; tune.py orders by the function)
    xnumel: int
    rnumel: int
    variants: tuple[TritonVariantEntry, ...]  # the default first
    # A matmul call and its epilogue kernel as one template (tasks/codegen/triton_matmul.py):
    # what tune.py needs to run the call and the kernel as the library would, and to time the
    # template against them (tune.py: tune_matmul). None for a plain kernel.
    matmul: MatmulFacts | None = None

    def to_json(self) -> dict[str, Any]:
        extra = {} if self.matmul is None else {"matmul": self.matmul.to_json()}
        return self.head_json() | extra | {"kernel": self.kernel, "file": self.file,
                                           "signature": dict(self.signature), "xnumel": self.xnumel,
                                           "rnumel": self.rnumel,
                                           "variants": [v.to_json() for v in self.variants]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CudaKernelEntry:
        return cls(**cls.head_from(data), kernel=str(data["kernel"]), file=str(data["file"]),
                   signature={str(k): str(v) for k, v in data["signature"].items()},
                   xnumel=int(data["xnumel"]), rnumel=int(data["rnumel"]),
                   variants=tuple(TritonVariantEntry.from_json(v) for v in data["variants"]),
                   matmul=MatmulFacts.from_json(data["matmul"]) if "matmul" in data else None)

    def default(self) -> tuple[TritonVariantEntry, Mapping[str, int]]:
        """The candidate an untuned build ships: the first variant's first config."""
        return self.variants[0], self.variants[0].configs[0]

    def compiles_default(self) -> bool:
        """Whether the default is a kernel to compile: not a matmul pair's library calls."""
        return self.variants[0].name != LIBRARY


@dataclass(frozen=True)
class CudaKernelsJson:
    folder: str  # the modules, beside kernels.json
    arch: int  # the SM arch a build without a GPU compiles for
    kernels: tuple[CudaKernelEntry, ...]

    def to_json(self) -> dict[str, Any]:
        return {"target": "cuda", "folder": self.folder, "arch": self.arch,
                "kernels": [k.to_json() for k in self.kernels]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CudaKernelsJson:
        kernels = tuple(CudaKernelEntry.from_json(k) for k in data["kernels"])
        return cls(str(data["folder"]), int(data["arch"]), kernels)
