"""Run generated Triton source under TRITON_INTERPRET=1 on CPU tensors, in a process of its own
(`run_sources`; see triton_kernel_harness.py's note on why a fresh process): each job is a
source, its function's name, a grid, positional arguments and constexprs; the tensors the jobs
hold are returned after their kernels ran."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import torch


def run_sources(jobs: list[dict[str, Any]], timeout: float = 600) -> list[list[Any]]:
    """Each job's arguments after its kernel ran (tensors written in place), or an AssertionError
    with the worker's traceback."""
    from tests.conftest import python_path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "jobs.pt"
        torch.save(jobs, path)
        env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=python_path())
        proc = subprocess.run([sys.executable, "-m", "tests.triton_source_worker", str(path)],
                              capture_output=True, text=True, env=env, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise AssertionError(f"worker failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}")
        results: list[list[Any]] = torch.load(Path(tmp) / "results.pt")
        return results


def compile_sources(jobs: list[dict[str, Any]], timeout: float = 600) -> list[str]:
    """Compile each job's kernel for sm_90 (ptxas, no GPU) at its constexprs, with its
    "signature" and "options"; returns an error text per job ("" where it compiled)."""
    import json

    from tests.conftest import python_path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "jobs.json"
        path.write_text(json.dumps(jobs))
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env |= {"TRITON_DISABLE_LINE_INFO": "1", "PYTHONPATH": python_path(), "TRITON_CACHE_DIR": tmp}
        proc = subprocess.run([sys.executable, "-m", "tests.triton_source_worker", "--compile", str(path)],
                              capture_output=True, text=True, env=env, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise AssertionError(f"worker failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}")
        errors: list[str] = json.loads((Path(tmp) / "compiled.json").read_text())
        return errors


def _compile_worker(path: Path) -> None:
    import json

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tests.triton_kernel_harness import load_module

    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, job in enumerate(json.loads(path.read_text())):
            try:
                module = load_module(job["source"], f"{job['name']}_{n}", Path(tmp))
                src = ASTSource(fn=getattr(module, job["name"]), signature=job["signature"],
                                constexprs=job["constexprs"])
                triton.compile(src, target=GPUTarget("cuda", 90, 32), options=job["options"])
                errors.append("")
            except Exception:
                errors.append(traceback.format_exc()[-3000:])
    (path.parent / "compiled.json").write_text(json.dumps(errors))


def _worker(path: Path) -> None:
    from tasks.codegen.triton_kernel import interpreter_libdevice
    from tests.triton_kernel_harness import load_module

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, job in enumerate(torch.load(path)):
            module = load_module(job["source"], f"{job['name']}_{n}", Path(tmp))
            setattr(module, "libdevice", interpreter_libdevice())  # noqa: B010 - see interpreter_libdevice
            getattr(module, job["name"])[tuple(job["grid"])](*job["args"], **job["constexprs"])
            results.append(job["args"])
    torch.save(results, path.parent / "results.pt")


if __name__ == "__main__":
    try:
        if sys.argv[1] == "--compile":
            _compile_worker(Path(sys.argv[2]))
        else:
            _worker(Path(sys.argv[1]))
    except Exception:
        traceback.print_exc()
        sys.exit(1)
