"""The CPU target's tuning code: C++ variants per distinct kernel, described in kernels.json.

Kernels with the same key (twelve identical layers) are generated, built and tuned once; the
function is named by the key, so the wrapper calls one symbol for all of them.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cache.hashing import pretty_json
from contract.job import StageJob
from contract.toolchain import cxx, kernel_flags
from tasks.codegen.cpp_build import RUNTIME
from tasks.codegen.cpp_kernel import CpuVariant, kernel_source
from tasks.gen_tuning.spec import kernel_params
from tasks.gen_tuning.stage import run_with, written
from tasks.schedule.model import Kernel, Schedule, kernel_places, kernels_by_key
from tasks.targets.cpu.spec import CpuKernelEntry, CpuKernelsJson, CpuVariantFile
from tasks.targets.cpu.symbols import function_for

TUNER = Path(__file__).resolve().parent / "tune.py"  # copied into the build as tune.py
FEW_ROWS = 64  # below this many rows, splitting each pass over R across threads is a candidate


def cpu_variants(k: Kernel) -> list[CpuVariant]:
    """The default first, then the alternatives worth timing for this kernel's shape."""
    variants = [CpuVariant(1, True), CpuVariant(1, False)]
    if len(k.ranges) >= 2:
        variants.append(CpuVariant(2, True))
    if k.reduce_ranges and math.prod(k.ranges) < FEW_ROWS:
        variants.append(CpuVariant(1, True, split_r=True))
    if math.prod(k.ranges) * max(1, math.prod(k.reduce_ranges)) < 4096:
        variants.append(CpuVariant(0, True))
    return variants


def run(job: StageJob) -> Mapping[str, Any]:
    """The cpu target's gen-tuning-code entry."""
    return run_with(job, lambda schedule, out: write(schedule, out, job.env["isa"]))


def write(schedule: Schedule, out: Path, isa: str) -> CpuKernelsJson:
    folder = out / "kernels"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(RUNTIME / "kiln_cpu.h", folder / "kiln_cpu.h")
    places = kernel_places(schedule)
    entries = tuple(written(group[0], lambda group=group: _entry(  # type: ignore[misc]
        group, folder, tuple(sorted({p for k in group for p in places.get(k.name, ())}))))
        for group in kernels_by_key(schedule).values())
    spec = CpuKernelsJson("kernels", (Path(cxx()).name, *kernel_flags(isa)), entries)
    (out / "kernels.json").write_text(pretty_json(spec.to_json()))
    shutil.copyfile(TUNER, out / "tune.py")
    return spec


def _entry(group: list[Kernel], folder: Path, places: tuple[str, ...]) -> CpuKernelEntry:
    k = group[0]
    variants = []
    for variant in cpu_variants(k):
        rel = f"{k.key[:16]}/{variant.name}.cpp"
        (folder / rel).parent.mkdir(exist_ok=True)
        (folder / rel).write_text(kernel_source(k, variant, function_for(k.key)))
        config = {"parallel": variant.parallel, "simd": variant.simd, "split_r": variant.split_r}
        variants.append(CpuVariantFile(variant.name, rel, config))
    return CpuKernelEntry(k.key, tuple(g.name for g in group), tuple(k.origins[:3]), places, kernel_params(k),
                          function_for(k.key), tuple(variants))
