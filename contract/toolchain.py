"""The tools a build runs, picked in one place: the C++ compiler, its flags and the x86-64 level
it compiles for; and, for the cuda target, the ptxas Triton assembles cubins with.

The key facts (contract.facts) report exactly what these functions pick, and the stages
compile with exactly that, so a key can never name one compiler while the build runs another.
Nothing here imports torch or triton: a no-op recompile reads these facts too.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

from contract.errors import KilnError

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
CROSS_ARCH = 90  # sm_90: the arch cubins are built for when no GPU is visible


def find_cxx() -> str | None:
    """The C++ compiler builds run: $CXX where set (a name on PATH or a path), else g++, else c++."""
    wanted = os.environ.get("CXX")
    if wanted:
        return shutil.which(wanted)
    return shutil.which("g++") or shutil.which("c++")


def cxx() -> str:
    found = find_cxx()
    if found is None:
        wanted = os.environ.get("CXX")
        if wanted:
            raise KilnError(f"the C++ compiler $CXX={wanted} is not found",
                            "set CXX to one compiler, a name on PATH or a path (or unset it for g++)")
        raise KilnError("no C++ compiler (g++ or c++) on PATH", "install g++, or set CXX to a C++ compiler")
    return found


def tool_version(path: str) -> str:
    """The first line a tool prints for --version ("unknown" when it prints nothing)."""
    lines = [line for line in _version_text(path).splitlines() if line.strip()]
    return lines[0] if lines else "unknown"


def cxx_fact() -> str:
    """The key fact for the compiler: the path that runs and what it says it is."""
    path = find_cxx()
    return "absent" if path is None else f"{path}: {tool_version(path)}"


_V3_FLAGS = {"avx2", "fma", "bmi2", "f16c", "movbe"}


@functools.cache
def host_isa() -> str:
    """The x86-64 level CPU kernels are compiled for: v3 (AVX2, FMA) where this CPU has it.

    Note: a build is tied to that level, not to this exact CPU (no -march=native): model.so
    checks the level when it is created and says so on a CPU without it.
    """
    if platform.machine() not in ("x86_64", "AMD64"):
        return "generic"
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "x86-64"
    lines = [line for line in text.splitlines() if line.startswith("flags")]
    flags = set(lines[0].split(":", 1)[1].split()) if lines else set()
    return "x86-64-v3" if flags >= _V3_FLAGS else "x86-64"


def isa_flags(isa: str) -> tuple[str, ...]:
    """Code generation flags for an x86-64 level (host_isa)."""
    return ("-march=x86-64-v3",) if isa == "x86-64-v3" else ()


def kernel_flags(isa: str) -> tuple[str, ...]:
    return (*FLAGS, *isa_flags(isa))


_PTXAS_TOOLS = ("ptxas", "ptxas-blackwell")
_RELEASE = re.compile(r"release \S+ V(\S+)")


def ptxas_fact() -> str:
    """The ptxas versions Triton may assemble cubins with, found without importing triton.

    Note: which binary Triton runs depends on its version and the arch (triton 3.9 uses its
    ptxas-blackwell from sm_90 up, and TRITON_PTXAS[_BLACKWELL]_PATH overrides either, falling
    back to the bundled one), so the fact names every candidate's version: exact for any triton.
    """
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return "absent"
    bundled = Path(next(iter(spec.submodule_search_locations))) / "backends" / "nvidia" / "bin"
    found = []
    for tool in _PTXAS_TOOLS:
        override = os.environ.get(f"TRITON_{tool.upper().replace('-', '_')}_PATH")
        for path in ([override] if override else []) + [str(bundled / tool)]:
            if Path(path).is_file():
                version = _RELEASE.search(_version_text(path))
                found.append(f"{tool}={version.group(1) if version else 'unknown'}")
    return ",".join(dict.fromkeys(found)) or "absent"


@functools.cache
def _version_text(path: str) -> str:
    """What `path --version` prints ("" when it cannot run)."""
    try:
        return subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30,
                              check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
