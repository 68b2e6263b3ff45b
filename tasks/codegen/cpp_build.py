"""Compiling generated C++ on the host: the flags every CPU kernel, wrapper and model is built with."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

from pipeline.envfacts import host_isa

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
# Note: no -ffast-math: kiln must give eager's NaN and infinity behaviour. -fno-trapping-math
# changes no result (kiln never unmasks FP exceptions); without it GCC will not if-convert the
# selects of kiln::exp and friends, and a loop that calls them stays scalar. The x86-64 level
# comes from the host (isa_flags), never -march=native, which would tie a build to one CPU.
FLAGS = ("-std=c++17", "-O3", "-fPIC", "-shared", "-fopenmp", "-fno-math-errno", "-fno-trapping-math")
# Note: the wrapper only calls kernels and the shim: -O1 compiles it in a third of -O2's time
# and runs no slower. The runtime is compiled once per compiler and torch, so it gets -O2.
WRAPPER_FLAGS = ("-std=c++17", "-O1", "-fPIC", "-fno-math-errno")
RUNTIME_FLAGS = ("-std=c++17", "-O2", "-fPIC")
LINK_FLAGS = ("-shared", "-fopenmp")


def isa_flags(isa: str) -> tuple[str, ...]:
    """Code generation flags for an x86-64 level (pipeline.envfacts.host_isa)."""
    return ("-march=x86-64-v3",) if isa == "x86-64-v3" else ()


def kernel_flags(isa: str) -> tuple[str, ...]:
    return (*FLAGS, *isa_flags(isa))
TORCH_LIBS = ("-ltorch_cpu", "-lc10")


def compiler() -> str:
    found = shutil.which("g++") or shutil.which("c++")
    if found is None:
        raise RuntimeError("no C++ compiler (g++) on PATH")
    return found


def torch_root() -> Path:
    """torch's package folder, found without importing torch (a second and a half)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("torch is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def torch_include() -> Path:
    return torch_root() / "include"


def torch_lib() -> Path:
    return torch_root() / "lib"


def run_compiler(cmd: list[str], cwd: Path | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=cwd)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:1] + cmd[-3:])} failed:\n{proc.stderr[-4000:]}")


def build_shared(source: Path, out: Path, include: tuple[Path, ...] = ()) -> None:
    includes = [f"-I{p}" for p in (RUNTIME, *include)]
    cmd = [compiler(), *kernel_flags(host_isa()), *includes, str(source), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"C++ build of {source.name} failed:\n{proc.stderr[-4000:]}")
