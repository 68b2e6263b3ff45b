"""Facts about the machine that keys may depend on, read without importing torch.

Note: a no-op recompile must not pay for `import torch` (~1.5 s); package versions come from
installed distribution metadata instead, which costs about a millisecond each.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import shutil
import subprocess
from pathlib import Path

TARGETS = ("cpu", "cuda")


def package_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


@functools.cache
def cxx_version() -> str:
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        return "absent"
    try:
        out = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except OSError:
        return "absent"
    return out.splitlines()[0] if out else "unknown"


def gpu_visible() -> bool:
    """Whether an NVIDIA GPU is visible, judged from the driver's files (no CUDA import)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    gpus = Path("/proc/driver/nvidia/gpus")
    return (gpus.is_dir() and any(gpus.iterdir())) or Path("/dev/nvidia0").exists()


@functools.cache
def gpu_name() -> str:
    """The first visible GPU's model, from the driver's files (no CUDA import); "none" without one.
    Tuning results depend on it: an H100's winners are not an H200's."""
    if not gpu_visible():
        return "none"
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("Model:"):
                return line.split(":", 1)[1].strip()
    return "nvidia"


def default_target() -> str:
    return "cuda" if gpu_visible() else "cpu"


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


def env_fact(name: str, target: str) -> str:
    """The value of one named environment fact, for keys and for `explain`."""
    if name == "python":
        return platform.python_version()
    if name == "target":
        return target
    if name == "cxx":
        return cxx_version()
    if name == "triton":  # only the cuda target's kernels are Triton's
        return package_version(name) if target == "cuda" else "-"
    if name in ("torch", "safetensors"):
        return package_version(name)
    if name == "isa":
        return host_isa()
    if name == "gpu":
        return gpu_name() if target == "cuda" else "none"
    raise KeyError(f"unknown environment fact {name!r}")
