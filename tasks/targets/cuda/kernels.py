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
from contract.job import StageJob
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
from tasks.gen_tuning.spec import kernel_params
from tasks.gen_tuning.stage import run_with
from tasks.schedule.model import Kernel, Schedule, kernel_places, kernels_by_key
from tasks.targets.cuda.spec import CudaKernelEntry, CudaKernelsJson, TritonVariantEntry

TUNER = Path(__file__).resolve().parent / "tune.py"  # copied into the build as tune.py


def function_for(name: str, variant: TritonVariant) -> str:
    return f"{name}_{variant.kind}"


def run(job: StageJob) -> Mapping[str, Any]:
    """The cuda target's gen-tuning-code entry."""
    return run_with(job, write)


def write(schedule: Schedule, out: Path) -> CudaKernelsJson:
    folder = out / "kernels"
    folder.mkdir(parents=True, exist_ok=True)
    places = kernel_places(schedule)
    entries = tuple(_entry(group, folder, tuple(sorted({p for k in group for p in places.get(k.name, ())})))
                    for group in kernels_by_key(schedule).values())
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
