"""Compiling generated C++ on the host, with the compiler and flags contract.toolchain picks."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

from contract.toolchain import cxx, kernel_flags

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
TORCH_LIBS = ("-ltorch_cpu", "-lc10")


def compiler() -> str:
    """The C++ compiler every build runs (the one the `cxx` key fact names)."""
    return cxx()


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


def build_shared(source: Path, out: Path, isa: str, include: tuple[Path, ...] = ()) -> None:
    """A kernel source built into a shared library for `isa` (an x86-64 level; the engine's
    `isa` fact measures the host's)."""
    includes = [f"-I{p}" for p in (RUNTIME, *include)]
    cmd = [compiler(), *kernel_flags(isa), *includes, str(source), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"C++ build of {source.name} failed:\n{proc.stderr[-4000:]}")
