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
from tasks.codegen.inputs import index_bounds
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
from tasks.gen_tuning.stage import run_with
from tasks.ir.serialize import buffer_json
from tasks.schedule.model import Kernel, Schedule, kernel_places, kernels_by_key

TUNER = Path(__file__).resolve().parent / "tune.py"  # copied into the build as tune.py


def function_for(name: str, variant: TritonVariant) -> str:
    return f"{name}_{variant.kind}"


def run(job: StageJob) -> Mapping[str, Any]:
    """The cuda target's gen-tuning-code entry."""
    return run_with(job, write)


def write(schedule: Schedule, out: Path) -> dict[str, Any]:
    folder = out / "kernels"
    folder.mkdir(parents=True, exist_ok=True)
    places = kernel_places(schedule)
    entries = [_entry(group, folder) | {"places": sorted({p for k in group for p in places.get(k.name, ())})}
               for group in kernels_by_key(schedule).values()]
    spec = {"target": "cuda", "folder": "kernels", "arch": CROSS_ARCH, "kernels": entries}
    (out / "kernels.json").write_text(pretty_json(spec))
    shutil.copyfile(TUNER, out / "tune.py")
    return spec


def module_source(k: Kernel, name: str, variants: list[TritonVariant]) -> str:
    """One file per kernel: each variant's function, then its candidate configs."""
    parts = [triton_source(k, v, function_for(name, v)) for v in variants]
    text = "\n\n".join(part.rstrip("\n") for part in parts)
    table = {function_for(name, v): configs(k, v) for v in variants}
    return f"{text}\n\n\nCONFIGS = {table!r}\n"


def _entry(group: list[Kernel], folder: Path) -> dict[str, Any]:
    k = group[0]
    name = kernel_name(k)
    variants = triton_variants(k)
    rel = f"{k.key[:16]}.py"
    (folder / rel).write_text(module_source(k, name, variants))
    bounds = index_bounds(k)
    params = [buffer_json(p.spec) | {"role": p.role, "bound": bounds.get(p.name)} for p in k.params]
    return {
        "key": k.key, "names": [g.name for g in group], "origins": list(k.origins), "kernel": name,
        "file": rel, "params": params, "signature": signature(k),
        "xnumel": xnumel(k), "rnumel": max(1, rnumel(k)),
        "variants": [{"name": v.kind, "function": function_for(name, v), "configs": configs(k, v),
                      "tile": list(tile_numels(k, v))} for v in variants],
    }
