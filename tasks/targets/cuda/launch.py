"""How the cuda target's wrapper runs a kernel: a launch of its tuned cubin, through the kernel
table model.so loads at kiln_model_create (the cubins are linked in as data)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from contract.job import StageJob
from contract.timings import MATMUL_PAIR, TEMPLATE
from tasks.codegen.triton_kernel import TritonVariant, grid, kernel_name, rnumel, tile_split, xnumel
from tasks.codegen.triton_matmul import Matmul, matmul_epilogue, matmul_grid, matmul_name
from tasks.gen_cpp.stage import run_with
from tasks.gen_cpp.wrapper import GraphNames, WrapperError
from tasks.ir.nodes import Extern
from tasks.schedule.model import Kernel
from tasks.targets.cuda.decisions import CudaDecision, LaunchFacts, read_tuning
from tasks.targets.cuda.symbols import cubin_symbol


def run(job: StageJob) -> Mapping[str, Any]:
    """The cuda target's gen-cpp entry."""
    return run_with(job, CudaLauncher)


def launch_grid(k: Kernel, decision: CudaDecision) -> int:
    """Programs to launch for the tuned variant and config (tune.py's grid, the same formula)."""
    name = decision.variant
    variant = TritonVariant(name, tile_split(k) if name == "tiled" else 0)
    _no_scratch(k, decision.facts())
    return grid(k, variant, dict(decision.config))[0]


def _no_scratch(k: Kernel, facts: LaunchFacts) -> None:
    if facts.global_scratch_size or facts.profile_scratch_size:
        raise WrapperError(f"kernel {k.name} needs Triton scratch memory, which kiln's launcher lacks")


class CudaLauncher:
    target = "cuda"

    def __init__(self, tuning: Mapping[str, Any]) -> None:
        self.tuning = read_tuning(tuning)  # kernel key -> decision and launch facts
        self.pairs: dict[tuple[Extern, str], Matmul] = {}  # (call, epilogue's key) -> the template fused

    def call(self, k: Kernel, names: GraphNames, index: int) -> list[str]:
        """A Triton kernel's launch: its arguments' addresses, in the cubin's signature order."""
        decision = self.tuning.get(k.key)
        if decision is None:
            raise WrapperError(f"kernel {k.name} has no tuning decision")
        programs = launch_grid(k, decision)
        folded = set(decision.facts().folded)  # constants in the cubin: not passed
        args = [f"&{names[p.buffer]}" for p in k.params if p.name not in folded]
        args += [f"&n[{i}]" for i, name in enumerate(("xnumel", "rnumel")) if name not in folded]
        sizes = f"{xnumel(k)}, {max(1, rnumel(k))}"
        return [f"{{  // {k.name}: {', '.join(k.origins)}"[:120],
                f"  int32_t n[] = {{{sizes}}};  // xnumel, rnumel",
                f"  void* a[] = {{{', '.join(args)}}};",
                f"  kiln::launch(ctx, {index}, {programs}, a, {len(args)});",
                "}"]

    def fused(self, call: Extern, k: Kernel) -> str | None:
        """The key of the matmul template that runs `call` and its epilogue kernel `k` as one,
        where autotune chose it (tasks/targets/cuda/tune.py: tune_matmul); None: run them apart."""
        m = matmul_epilogue(call, k)
        decision = None if m is None else self.tuning.get(m.key)
        if m is None or decision is None or decision.launch is None:
            return None
        self.pairs[call, k.key] = m
        return m.key

    def call_fused(self, call: Extern, k: Kernel, names: GraphNames, index: int) -> list[str]:
        """The template's launch: the call's inputs where the call would read them, then the
        epilogue's parameters but the product (which never reaches memory)."""
        m = self.pairs[call, k.key]
        decision = self.tuning[m.key]
        facts = decision.facts()
        _no_scratch(k, facts)
        if facts.folded:  # explicit_compile folds none (tune.py: _folded_arguments)
            raise WrapperError(f"the matmul template of kernel {k.name} has arguments folded into its cubin")
        programs = matmul_grid(m, dict(decision.config))[0]
        views = m.views()
        pointers = [f"void* m{i} = {names.at(v)};" for i, v in enumerate(views.values())]
        params = {p.name: p for p in m.epilogue.params}
        args = [f"&m{i}" for i in range(len(views))]
        args += [f"&{names[params[name].buffer]}" for name in m.param_names()[len(views):]]
        return [f"{{  // {matmul_name(m)}: {call.op.value} and {', '.join(k.origins)}"[:120],
                f"  {' '.join(pointers)}",
                f"  void* a[] = {{{', '.join(args)}}};",
                f"  kiln::launch(ctx, {index}, {programs}, a, {len(args)});",
                "}"]

    def prototypes(self, kernels: Mapping[str, Kernel]) -> list[str]:
        return [f"extern const unsigned char {cubin_symbol(key)}[];" for key in sorted(kernels)]

    def table_rows(self, kernels: Mapping[str, Kernel]) -> list[str]:
        """One row per kernel, in the order of first launch (the index each launch names)."""
        rows = []
        for key, k in kernels.items():
            decision = self.tuning[key]
            facts = decision.facts()
            label = f"{MATMUL_PAIR}{kernel_name(k)}" if decision.variant == TEMPLATE else kernel_name(k)
            name, function = json.dumps(label), json.dumps(facts.name)
            rows.append(f"  {{{name}, {cubin_symbol(key)}, {function}, {facts.num_warps}, {facts.shared}}},")
        return rows

