"""The link stage's entry: wrapper.cpp + the kernels' objects + the runtime -> model.so.

It compiles against kiln_model.h and torch's stable C shim only, never ATen's headers (a file
that includes ATen takes 17 s to compile; the shim, a fraction of a second). The runtime's
objects are a cache item of their own (tasks/link/runtime.py), built once per machine, and on a
cold cache usually ahead of link, beside trace.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from contract.errors import KilnError
from contract.job import StageJob
from contract.toolchain import LINK_FLAGS, WRAPPER_FLAGS, isa_flags
from tasks.codegen.cpp_build import (
    RUNTIME,
    TORCH_LIBS,
    compiler,
    run_compiler,
    torch_include,
    torch_lib,
)
from tasks.link.runtime import runtime_objects

MODEL_SO = "model.so"
HEADER = "kiln_model.h"


def run(job: StageJob) -> Mapping[str, Any]:
    wrapper = job.input("gen-cpp/wrapper.cpp")
    tuning = job.input("autotune/tuning.json")
    keys = sorted(json.loads(tuning.read_text()))
    cxx = compiler()
    out = job.out_dir
    with tempfile.TemporaryDirectory() as tmp:
        if job.env["target"] == "cuda":
            objects = [_cubins_object(cxx, [tuning.parent / "cubins" / f"{key[:16]}.cubin" for key in keys],
                                      Path(tmp))]
        else:
            objects = [tuning.parent / "objects" / f"{key[:16]}.o" for key in keys]
        wrapper_o = Path(tmp) / "wrapper.o"
        with ThreadPoolExecutor(max_workers=2) as pool:
            runtime = pool.submit(runtime_objects, job.items(), cxx, job.env, job.code)
            compiled = pool.submit(_compile_wrapper, cxx, wrapper, wrapper_o, job.env["isa"])
            compiled.result()
            runtime_os, item, hit = runtime.result()
        try:
            run_compiler([cxx, *LINK_FLAGS, str(wrapper_o), *map(str, runtime_os), *map(str, objects),
                          "-o", str(out / MODEL_SO), f"-L{torch_lib()}", *TORCH_LIBS, "-ldl"])
        except RuntimeError as err:
            raise KilnError(f"model {job.model!r}: linking model.so failed: {err}") from None
    shutil.copyfile(RUNTIME / HEADER, out / HEADER)
    what = f"{len(keys)} cubins" if job.env["target"] == "cuda" else f"{len(keys)} kernel objects"
    note = f"{what}; runtime {'cached' if hit else 'compiled'}"
    used = f"{item.stage}/{item.key}"
    return {"kernels": len(keys), "runtime_cached": hit, "items": [used], "summary": note}


def _cubins_object(cxx: str, cubins: list[Path], tmp: Path) -> Path:
    """One object holding every cubin, each under the symbol the wrapper's kernel table names.

    Note: assembled with .incbin from names relative to the folder it runs in, so the object
    holds no path and the bytes of the cubins only.
    """
    from tasks.gen_cpp.wrapper import cubin_symbol

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


def _compile_wrapper(cxx: str, wrapper: Path, out: Path, isa: str) -> None:
    try:
        # Note: compiled from its own folder by a relative name, so no absolute path reaches
        # the object and model.so is byte-identical wherever the cache lives.
        runtime = f"-I{RUNTIME}"  # codedeps: cpp_build's RUNTIME reads all of runtime/
        flags = [*WRAPPER_FLAGS, *isa_flags(isa), runtime, f"-I{torch_include()}"]
        run_compiler([cxx, *flags, "-c", wrapper.name,
                      "-o", str(out)], cwd=wrapper.parent)
    except RuntimeError as err:
        raise KilnError(f"the generated wrapper does not compile: {err}",
                        "this is a bug in kiln's gen-cpp stage; please report it") from None
