"""How the cpu target's wrapper runs a kernel: a direct call of the function autotune's winning
variant defines (its object is linked into model.so under that name)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contract.job import StageJob
from tasks.codegen.cpp_kernel import param_decl
from tasks.gen_cpp.stage import run_with
from tasks.gen_cpp.wrapper import GraphNames, WrapperError
from tasks.ir.nodes import Buffer, Extern
from tasks.schedule.model import Kernel
from tasks.targets.cpu.symbols import function_for


def run(job: StageJob) -> Mapping[str, Any]:
    """The cpu target's gen-cpp entry."""
    return run_with(job, lambda tuning: CpuLauncher())


class CpuLauncher:
    target = "cpu"

    def call(self, k: Kernel, names: GraphNames, index: int) -> list[str]:
        args = [f"static_cast<{_pointer_type(p.spec, p.role)}>({names[p.buffer]})" for p in k.params]
        return [f"// {k.name}: {', '.join(k.origins)}"[:120], f"{function_for(k.key)}({', '.join(args)});"]

    def fused(self, call: Extern, k: Kernel) -> str | None:
        return None  # the cpu target has no matmul template: every call and kernel runs apart

    def call_fused(self, call: Extern, k: Kernel, names: GraphNames, index: int) -> list[str]:
        raise WrapperError("the cpu target runs no matmul pair as one kernel")

    def prototypes(self, kernels: Mapping[str, Kernel]) -> list[str]:
        return [f"void {function_for(key)}({', '.join(param_decl(p.spec, p.role) for p in k.params)});"
                for key, k in sorted(kernels.items())]

    def table_rows(self, kernels: Mapping[str, Kernel]) -> list[str]:
        return []  # nothing to load at run time: the kernels are linked in


def _pointer_type(spec: Buffer, role: str) -> str:
    decl = param_decl(spec, role)
    return decl.split("*")[0].strip() + "*"
