"""What the cuda target links into model.so: its kernels' cubins, as data."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from contract.errors import KilnError
from contract.job import StageJob
from tasks.codegen.cpp_build import run_compiler
from tasks.link.stage import run_with
from tasks.targets.cuda.decisions import read_tuning
from tasks.targets.cuda.symbols import cubin_symbol


def run(job: StageJob) -> Mapping[str, Any]:
    """The cuda target's link entry."""
    return run_with(job, kernel_objects)


def kernel_objects(tuned: Path, keys: list[str], cxx: str, tmp: Path) -> tuple[list[Path], str]:
    """Every decision's cubin: none for a matmul pair whose library calls won (no launch)."""
    decisions = read_tuning(json.loads((tuned / "tuning.json").read_text()))
    cubins = [tuned / "cubins" / f"{key[:16]}.cubin" for key in keys if decisions[key].launch is not None]
    return [cubins_object(cxx, cubins, tmp)], f"{len(cubins)} cubins"


def cubins_object(cxx: str, cubins: list[Path], tmp: Path) -> Path:
    """One object holding every cubin, each under the symbol the wrapper's kernel table names.

    Note: assembled with .incbin from names relative to the folder it runs in, so the object
    holds no path and the bytes of the cubins only.
    """
    lines = ['.section .note.GNU-stack,"",@progbits', ".section .rodata"]
    for path in cubins:
        key = path.stem
        shutil.copyfile(path, tmp / f"{key}.cubin")
        symbol = cubin_symbol(key)
        lines += [f".global {symbol}", f".type {symbol}, @object", ".balign 64", f"{symbol}:",
                  f'.incbin "{key}.cubin"', f".size {symbol}, . - {symbol}"]
    (tmp / "cubins.S").write_text("\n".join(lines) + "\n")
    try:
        run_compiler([cxx, "-c", "cubins.S", "-o", "cubins.o"], cwd=tmp)
    except RuntimeError as err:
        raise KilnError(f"assembling the cubins failed: {err}", "a bug in kiln's link stage") from None
    return tmp / "cubins.o"
