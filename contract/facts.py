"""Facts about the machine that keys may depend on, read without importing torch.

Note: a no-op recompile must not pay for `import torch` (~1.5 s); package versions come from
installed distribution metadata instead, which costs about a millisecond each.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

from contract.executor_settings import tuning_gpu
from contract.toolchain import CROSS_ARCH, cxx_fact, host_isa, ptxas_fact

TARGETS = ("cpu", "cuda")


def package_version(dist: str) -> str:
    """The installed version of a distribution, or "absent".

    Note: its METADATA's Version line, read by a regex: importlib's version() parses the whole
    file as an email message, and a no-op compile asks for some fifty of them."""
    try:
        found = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"
    version = re.search(r"^Version:[ \t]*(\S+)", found.read_text("METADATA") or "", re.MULTILINE)
    return version.group(1) if version else found.version


def gpu_visible() -> bool:
    """Whether an NVIDIA GPU is visible, judged from the driver's files (no CUDA import)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    gpus = Path("/proc/driver/nvidia/gpus")
    return (gpus.is_dir() and any(gpus.iterdir())) or Path("/dev/nvidia0").exists()


def gpu_name() -> str:
    """The model of the first GPU this process may use; "none" without one. Tuning results
    depend on it: an H100's winners are not an H200's."""
    return _first_gpu()[0] if gpu_visible() else "none"


def machine_facts(target: str) -> dict[str, int]:
    """How much of this machine a stage may spread its work over: its cores, and for the cuda
    target the GPUs it may use. Measured by the engine once per build and handed to the stages
    in their job (a stage reads no environment).

    Note: not key parts. They set how a stage spreads its work (how many compilers run at once,
    how many GPUs tune side by side), never what it writes: a kernel's winner depends on the
    model of GPU (the `gpu` fact, keyed), not on how many of them tuned. Keying them would make
    a cache built on a 16-core machine useless on a 2-core one for identical bytes.
    """
    return {"cores": len(os.sched_getaffinity(0)), "gpus": gpu_count() if target == "cuda" else 0}


def gpu_count() -> int:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES's entries, else every GPU the driver
    lists; 0 without one."""
    if not gpu_visible():
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return len([d for d in visible.split(",") if d.strip()])
    return max(1, len(list(Path("/proc/driver/nvidia/gpus").glob("*"))))


def default_target() -> str:
    return "cuda" if gpu_visible() else "cpu"


def gpu_arch() -> str:
    """The arch the cuda target's cubins are built for: the compute capability of the GPU that
    gpu_name names (tuning compiles for the GPU it runs on), or sm_90 without a GPU."""
    return _first_gpu()[1] if gpu_visible() else f"sm_{CROSS_ARCH}"


@functools.cache
def _first_gpu() -> tuple[str, str]:
    """(model, arch) of the first GPU this process may use, from one nvidia-smi query, so both
    facts name one GPU: CUDA_VISIBLE_DEVICES's first entry (an index or a UUID), else GPU 0.

    Note: nvidia-smi numbers GPUs in PCI order, as CUDA does under CUDA_DEVICE_ORDER=PCI_BUS_ID
    (the tuner maps indices the same way); without nvidia-smi the model comes from the driver's
    files and the arch is "unknown".
    """
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    first = (visible or ["0"])[0]
    query = ["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader", "-i", first]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout
        name, cap = (field.strip() for field in out.strip().splitlines()[0].rsplit(",", 1))
        major, minor = cap.split(".")
        return name, f"sm_{int(major)}{int(minor)}"
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return _driver_gpu_name(), "unknown"


def _driver_gpu_name() -> str:
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("Model:"):
                return line.split(":", 1)[1].strip()
    return "nvidia"


def env_fact(name: str, target: str, executor: Mapping[str, str] | None = None) -> str:
    """The value of one named environment fact, for keys and for `explain`. With the slurm
    executor, the cuda target's `gpu` and `arch` are the nodes' (executor_settings.tuning_gpu)."""
    if name in ("gpu", "arch") and target == "cuda" and executor is not None:
        cluster = tuning_gpu(executor)
        if cluster is not None:
            return cluster[0] if name == "gpu" else cluster[1]
    if name == "python":
        return platform.python_version()
    if name == "cxx":
        return cxx_fact()
    if name == "triton":  # only the cuda target's kernels are Triton's
        return package_version(name) if target == "cuda" else "-"
    if name in ("torch", "safetensors"):
        return package_version(name)
    if name == "isa":
        return host_isa()
    if name == "gpu":
        return gpu_name() if target == "cuda" else "none"
    if name == "arch":
        return gpu_arch() if target == "cuda" else "-"
    if name == "ptxas":
        return ptxas_fact() if target == "cuda" else "-"
    raise KeyError(f"unknown environment fact {name!r}")
