"""Run generated Triton kernels under TRITON_INTERPRET=1 on CPU tensors and compare them with the
schedule interpreter.

Note: TRITON_INTERPRET must be set before triton is first imported, not only when `@triton.jit`
runs: triton's own library functions (tl.sum, tl.reduce's helpers, tl.sigmoid) are jitted at
import, and a compiled-mode JITFunction refuses to run inside an interpreted kernel. torch.export
may import triton, so the checks run in a worker process (`python -m tests.triton_kernel_harness
jobs.json`) that sets the variable first; `check_interpreted` starts it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from tasks.codegen.triton_kernel import (
    TritonVariant,
    configs,
    grid,
    interpreter_libdevice,
    kernel_name,
    rnumel,
    triton_source,
    triton_variants,
    xnumel,
)
from tasks.ir.interpret import empty
from tasks.schedule.model import Kernel, kernel_from, kernel_json
from tasks.schedule.run import run_kernel
from tests.cpp_kernel_harness import _close, random_params


@contextmanager
def interpreting() -> Iterator[None]:
    """TRITON_INTERPRET=1 while the block runs (triton reads it when `@triton.jit` runs)."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old


def load_module(source: str, name: str, directory: Path) -> ModuleType:
    """Import generated source from a real file (triton reads the function's source)."""
    path = directory / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"kiln_triton_{name}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_interpreted(k: Kernel, variant: TritonVariant, config: dict[str, int],
                    tensors: dict[str, torch.Tensor]) -> None:
    name = kernel_name(k)
    with tempfile.TemporaryDirectory() as tmp, interpreting():
        module = load_module(triton_source(k, variant, name), name, Path(tmp))
        setattr(module, "libdevice", interpreter_libdevice())  # noqa: B010 - see interpreter_libdevice
        fn: Any = getattr(module, name)
        args = [tensors[p.buffer] for p in k.params]
        fn[grid(k, variant, config)](*args, xnumel(k), max(1, rnumel(k)), XBLOCK=config["XBLOCK"],
                            RBLOCK=config["RBLOCK"])
    sys.modules.pop(f"kiln_triton_{name}", None)


def run_compiled(k: Kernel, variant: TritonVariant, config: dict[str, int],
                 tensors: dict[str, torch.Tensor]) -> None:
    """The kernel compiled by triton for this machine's GPU, on copies of the tensors there."""
    name = kernel_name(k)
    with tempfile.TemporaryDirectory() as tmp:
        module = load_module(triton_source(k, variant, name), name, Path(tmp))
        on_gpu = {b: t.cuda() for b, t in tensors.items()}
        args = [on_gpu[p.buffer] for p in k.params]
        getattr(module, name)[grid(k, variant, config)](
            *args, xnumel(k), max(1, rnumel(k)), XBLOCK=config["XBLOCK"], RBLOCK=config["RBLOCK"],
            num_warps=config["num_warps"], num_stages=config["num_stages"])
        for b, t in on_gpu.items():
            tensors[b].copy_(t.cpu())
    sys.modules.pop(f"kiln_triton_{name}", None)


def check_kernel(k: Kernel, variant: TritonVariant, config: dict[str, int], rtol: float = 1e-4,
                 atol: float = 1e-5, on_gpu: bool = False) -> None:
    """The kernel (interpreted, or compiled and run on the GPU) against the schedule interpreter."""
    tensors = random_params(k)
    want = {b: t.clone() for b, t in tensors.items()}
    run_kernel(k, want, empty)
    got = {b: t.clone() for b, t in tensors.items()}
    (run_compiled if on_gpu else run_interpreted)(k, variant, config, got)
    for p in k.params:
        if p.role != "in":
            where = f"{k.name} {variant.kind} {config} {p.name}"
            _close(got[p.buffer], want[p.buffer], rtol, atol, where)


def interpret_configs(k: Kernel, variant: TritonVariant, budget: int = 256) -> list[dict[str, int]]:
    """The default config and one other, the cheapest to interpret (fewest program x chunk
    steps); a default that costs more than budget steps gives way to the next cheapest, since
    the interpreter runs programs one by one."""
    all_configs = configs(k, variant)

    def cost(c: dict[str, int]) -> int:
        chunks = -(-max(1, rnumel(k)) // c["RBLOCK"]) if variant.kind == "looped" else 1
        return grid(k, variant, c)[0] * chunks

    cheap = sorted(all_configs, key=cost)
    first = all_configs[0] if cost(all_configs[0]) <= budget else cheap[0]
    rest = [c for c in cheap if c != first]
    return [first, *rest[:1]]


def tolerances(k: Kernel) -> tuple[float, float]:
    half = any(p.spec.dtype.value in ("f16", "bf16") for p in k.params)
    return (1e-2, 1e-2) if half else (1e-4, 1e-5)


@dataclass(frozen=True)
class Job:
    kernel: Kernel
    variant: TritonVariant
    config: dict[str, int]
    rtol: float = 1e-4
    atol: float = 1e-5


def jobs_for(k: Kernel) -> list[Job]:
    """Every variant of k, each at its default config and one other."""
    rtol, atol = tolerances(k)
    return [Job(k, v, c, rtol, atol) for v in triton_variants(k) for c in interpret_configs(k, v)]


def check_interpreted(jobs: list[Job], timeout: float = 600) -> list[str]:
    """Run the jobs in an interpreting worker; returns one message per failed job."""
    from tests.conftest import python_path

    data = [{"kernel": kernel_json(j.kernel), "variant": [j.variant.kind, j.variant.split],
             "config": j.config, "rtol": j.rtol, "atol": j.atol} for j in jobs]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "jobs.json"
        path.write_text(json.dumps(data))
        env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=python_path())
        proc = subprocess.run([sys.executable, "-m", "tests.triton_kernel_harness", str(path)],
                              capture_output=True, text=True, env=env, timeout=timeout, check=False)
        if proc.returncode != 0:
            return [f"worker failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}"]
        failures: list[str] = json.loads((Path(tmp) / "failures.json").read_text())
        return failures


def compile_sm90(kernels: list[Kernel], timeout: float = 600) -> list[dict[str, Any]]:
    """Compile each kernel's default variant at its default config for sm_90 (no GPU needed; the
    GPU tests compile every variant), in a worker without TRITON_INTERPRET; returns per kernel
    {"name", "variant", "cubin_bytes", "shared", "num_warps"} or {"name", "variant", "error"}."""
    from tests.conftest import python_path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernels.json"
        path.write_text(json.dumps([kernel_json(k) for k in kernels]))
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env |= {"TRITON_DISABLE_LINE_INFO": "1", "PYTHONPATH": python_path(), "TRITON_CACHE_DIR": tmp}
        proc = subprocess.run([sys.executable, "-m", "tests.triton_kernel_harness", "--compile", str(path)],
                              capture_output=True, text=True, env=env, timeout=timeout, check=False)
        if proc.returncode != 0:
            return [{"name": "worker", "error": f"{proc.stdout}\n{proc.stderr[-4000:]}"}]
        results: list[dict[str, Any]] = json.loads((Path(tmp) / "compiled.json").read_text())
        return results


def _compile_worker(path: Path) -> None:
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for d in json.loads(path.read_text()):
            k = kernel_from(d)
            results.append(_compile_one(k, triton_variants(k)[0], Path(tmp)))
    (path.parent / "compiled.json").write_text(json.dumps(results))


def _compile_one(k: Kernel, variant: TritonVariant, tmp: Path) -> dict[str, Any]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tasks.codegen.triton_kernel import signature

    name = kernel_name(k)
    config = configs(k, variant)[0]
    try:
        module = load_module(triton_source(k, variant, name), f"{name}_{variant.kind}", tmp)
        src = ASTSource(fn=getattr(module, name), signature=signature(k),
                        constexprs={"XBLOCK": config["XBLOCK"], "RBLOCK": config["RBLOCK"]})
        options = {"num_warps": config["num_warps"], "num_stages": config["num_stages"]}
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
        meta = compiled.metadata
        return {"name": name, "variant": variant.kind, "cubin_bytes": len(compiled.asm["cubin"]),
                "shared": meta.shared, "num_warps": meta.num_warps}
    except Exception:
        return {"name": name, "variant": variant.kind, "error": traceback.format_exc()[-3000:]}


def _worker(path: Path) -> None:
    failures = []
    for d in json.loads(path.read_text()):
        k = kernel_from(d["kernel"])
        try:
            check_kernel(k, TritonVariant(*d["variant"]), d["config"], d["rtol"], d["atol"])
        except Exception:
            failures.append(f"{k.name} {d['variant']} {d['config']}:\n{traceback.format_exc()[-3000:]}")
    (path.parent / "failures.json").write_text(json.dumps(failures))


if __name__ == "__main__" and sys.argv[1] == "--compile":
    _compile_worker(Path(sys.argv[2]))
elif __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "the worker runs kernels under TRITON_INTERPRET=1"
    _worker(Path(sys.argv[1]))
