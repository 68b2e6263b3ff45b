"""The link stage: wrapper.cpp + the kernels' objects + the runtime -> model.so. Its entry is
the target's (tasks/targets/*/link.py), which supplies the kernels' objects.

It compiles against kiln_model.h and torch's stable C shim only, never ATen's headers (a file
that includes ATen takes 17 s to compile; the shim, a fraction of a second). The runtime's
objects are a cache item of their own (tasks/link/runtime.py), built once per machine, and on a
cold cache usually ahead of link, beside trace.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Mapping
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
from tasks.gen_cpp.wrapper import BOXED_HEADER
from tasks.link.runtime import boxed_object, runtime_objects

MODEL_SO = "model.so"
HEADER = "kiln_model.h"


KernelObjects = Callable[[Path, list[str], str, Path], tuple[list[Path], str]]


def run_with(job: StageJob, kernel_objects: KernelObjects) -> Mapping[str, Any]:
    """The stage, with the target's kernel objects: kernel_objects(autotune's folder, kernel keys,
    compiler, tmp) gives the objects to link and how to name them in the report. Each target's
    link entry (tasks/targets/*/link.py) calls this."""
    wrapper = job.input("gen-cpp/wrapper.cpp")
    tuning = job.input("autotune/tuning.json")
    keys = sorted(json.loads(tuning.read_text()))
    cxx = compiler()
    out = job.out_dir
    with tempfile.TemporaryDirectory() as tmp:
        objects, what = kernel_objects(tuning.parent, keys, cxx, Path(tmp))
        wrapper_o = Path(tmp) / "wrapper.o"
        boxed = f'#include "{BOXED_HEADER}"' in wrapper.read_text()
        with ThreadPoolExecutor(max_workers=3) as pool:
            runtime = pool.submit(runtime_objects, job.items(), cxx, job.env, job.code)
            boxed_o = pool.submit(boxed_object, job.items(), cxx, job.env, job.code) if boxed else None
            compiled = pool.submit(_compile_wrapper, cxx, wrapper, wrapper_o, job.env["isa"])
            compiled.result()
            runtime_os, item, hit = runtime.result()
            used = [f"{item.stage}/{item.key}"]
            if boxed_o is not None:
                boxed_path, boxed_item, _ = boxed_o.result()
                runtime_os = [*runtime_os, boxed_path]
                used.append(f"{boxed_item.stage}/{boxed_item.key}")
        try:
            run_compiler([cxx, *LINK_FLAGS, str(wrapper_o), *map(str, runtime_os), *map(str, objects),
                          "-o", str(out / MODEL_SO), f"-L{torch_lib()}", *TORCH_LIBS, "-ldl"])
        except RuntimeError as err:
            raise KilnError(f"model {job.model!r}: linking model.so failed: {err}") from None
    shutil.copyfile(RUNTIME / HEADER, out / HEADER)
    note = f"{what}; runtime {'cached' if hit else 'compiled'}" + ("; boxed calls" if boxed else "")
    return {"kernels": len(keys), "runtime_cached": hit, "items": used, "summary": note}


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
