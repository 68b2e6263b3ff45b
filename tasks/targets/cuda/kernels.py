"""The cuda target's tuning code: one Triton module per distinct kernel, and kernels.json.

Each module holds every variant of its kernel (`<name>_persistent`, `<name>_looped`, ...),
all with the same argument list, and its candidate configs as data; kernels.json says how to
make each kernel's inputs (shapes, strides, dtypes, index bounds) and how to launch it, so
tune.py can tune any kernel by itself, on random inputs, without the model.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cache.hashing import pretty_json
from contract.config import MATMUL_DEFAULT
from contract.job import StageJob
from contract.timings import LIBRARY, MATMUL_PAIR
from contract.toolchain import CROSS_ARCH
from tasks.codegen.triton_kernel import (
    TritonVariant,
    configs,
    kernel_name,
    rnumel,
    signature,
    tile_numels,
    triton_source,
    triton_variants,
    xnumel,
)
from tasks.codegen.triton_matmul import (
    Matmul,
    matmul_configs,
    matmul_name,
    matmul_pairs,
    matmul_signature,
    matmul_source,
)
from tasks.gen_tuning.spec import KernelParam, kernel_params
from tasks.gen_tuning.stage import run_with, written
from tasks.ir.nodes import Buffer
from tasks.schedule.model import Kernel, Schedule, kernel_places, kernels_by_key
from tasks.targets.cuda.spec import (
    CudaKernelEntry,
    CudaKernelsJson,
    MatmulFacts,
    TritonVariantEntry,
)

TUNER = Path(__file__).resolve().parent / "tune.py"  # copied into the build as tune.py


def function_for(name: str, variant: TritonVariant) -> str:
    return f"{name}_{variant.kind}"


def run(job: StageJob) -> Mapping[str, Any]:
    """The cuda target's gen-tuning-code entry."""
    matmul = str(job.config.get("tuning.matmul") or MATMUL_DEFAULT)
    return run_with(job, lambda schedule, out: write(schedule, out, matmul))


def write(schedule: Schedule, out: Path, matmul: str = MATMUL_DEFAULT) -> CudaKernelsJson:
    """kernels/, kernels.json and tune.py; `matmul` is the config's tuning.matmul (contract/
    config.py): whether each matmul pair's template is a candidate beside the library calls
    (auto), the only one (template), or not tried (library)."""
    folder = out / "kernels"
    folder.mkdir(parents=True, exist_ok=True)
    places = kernel_places(schedule)
    entries = tuple(written(group[0], lambda group=group: _entry(  # type: ignore[misc]
        group, folder, tuple(sorted({p for k in group for p in places.get(k.name, ())}))))
        for group in kernels_by_key(schedule).values())
    if matmul != LIBRARY:
        entries += tuple(_pair_entry(found, folder, with_library=matmul == "auto")
                         for found in matmul_pairs(schedule).values())
    spec = CudaKernelsJson("kernels", CROSS_ARCH, entries)
    (out / "kernels.json").write_text(pretty_json(spec.to_json()))
    shutil.copyfile(TUNER, out / "tune.py")
    return spec


def module_source(k: Kernel, name: str, variants: list[TritonVariant]) -> str:
    """One file per kernel: each variant's function, then its candidate configs."""
    parts = [triton_source(k, v, function_for(name, v)) for v in variants]
    text = "\n\n".join(part.rstrip("\n") for part in parts)
    table = {function_for(name, v): configs(k, v) for v in variants}
    return f"{text}\n\n\nCONFIGS = {table!r}\n"


def _entry(group: list[Kernel], folder: Path, places: tuple[str, ...]) -> CudaKernelEntry:
    k = group[0]
    name = kernel_name(k)
    variants = triton_variants(k)
    rel = f"{k.key[:16]}.py"
    (folder / rel).write_text(module_source(k, name, variants))
    entries = tuple(TritonVariantEntry(v.kind, function_for(name, v), tuple(configs(k, v)), tile_numels(k, v))
                    for v in variants)
    return CudaKernelEntry(k.key, tuple(g.name for g in group), tuple(k.origins), places, kernel_params(k),
                           name, rel, signature(k), xnumel(k), max(1, rnumel(k)), entries)


def _pair_entry(found: list[tuple[Matmul, str]], folder: Path, with_library: bool) -> CudaKernelEntry:
    """A matmul call and its epilogue kernel as one entry: the template, its configs, and (with
    the library) the call and the kernel as they run apart, the default a build without a GPU
    ships."""
    m = found[0][0]
    name = matmul_name(m)
    function = f"{name}_matmul"
    configs = matmul_configs(m)
    rel = f"{m.key[:16]}.py"
    table = {function: configs}
    (folder / rel).write_text(f"{matmul_source(m, function).rstrip()}\n\n\nCONFIGS = {table!r}\n")
    batch, rows, cols, _ = m.sizes
    template = TritonVariantEntry("matmul", function, tuple(configs), (rows, cols))
    library = TritonVariantEntry(LIBRARY, "", ({},), (rows, cols))
    alpha, beta = m.scales
    facts = MatmulFacts(m.call.op.value, alpha, beta, m.sizes, m.epilogue.key,
                        m.epilogue.params.index(m.product), tuple(m.unaligned()))
    heads = [KernelParam(Buffer(n, v.shape, v.stride, v.dtype, m.call.out.device), "in", None)
             for n, v in m.views().items()]
    rest = [p for p in kernel_params(m.epilogue) if p.spec.name != m.product.name]
    return CudaKernelEntry(m.key, tuple(f"{MATMUL_PAIR}{pair.epilogue.name}" for pair, _ in found),
                           (m.call.origin or m.call.op.value, *m.epilogue.origins),
                           tuple(sorted({place for _, place in found})), (*heads, *rest), name, rel,
                           matmul_signature(m), batch * rows * cols, 1,
                           (library, template) if with_library else (template,), facts)
