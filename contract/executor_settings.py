"""Where per-kernel work runs, and how its cluster jobs are submitted: one set of checks for the
three places a setting can come from (the --executor flag, a model config's [executor] table,
and $KILN_EXECUTOR / $KILN_SLURM_*). Settings are plain strings (they travel in StageJob) and
no key parts: a cluster run and a local run fill the same cache items. The one exception is the
cuda target's tuning GPU (tuning_gpu), which a local run's keys take from this host.

Precedence: the flag, then the environment, then the config, then the defaults (local; the
job defaults of tasks/autotune/executors.py's Slurm).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from contract.errors import KilnError

LOCAL, SLURM = "local", "slurm"
KINDS = (LOCAL, SLURM)
# each Slurm setting, and what its value must be (None: any text)
SLURM_SETTINGS: dict[str, str | None] = {
    "partition": None, "gres": None, "account": None,
    "time_min": "a whole number of minutes", "jobs": "a whole number",
    "queue_min": "a number of minutes", "exclusive": "0 or 1",
    # the cuda target's tuning GPU on the nodes, as nvidia-smi names it: "NVIDIA H200", sm_90
    "gpu": None, "arch": "sm_ and the compute capability, e.g. sm_90",
}
KEYS = ("kind", *SLURM_SETTINGS)


def check_kind(kind: str, where: str) -> str:
    if kind not in KINDS:
        raise KilnError(f"{where}={kind!r} is no executor", f"use one of {', '.join(KINDS)}")
    return kind


def check_setting(name: str, value: str, where: str) -> str:
    """`value` of Slurm setting `name`, or a clear error naming `where` it was set."""
    wanted = SLURM_SETTINGS[name]
    if name == "gpu" and value.lower() == "none":  # a node without a GPU tunes no cuda kernel
        raise KilnError(f"{where}={value!r} names no GPU", "name the nodes' GPU, e.g. \"NVIDIA H200\"")
    if wanted is None:
        return value
    if name == "arch":
        ok = value.startswith("sm_") and value[3:].isdigit()
    else:
        ok = value in ("0", "1") if name == "exclusive" else _positive(value, name != "queue_min")
    if not ok:
        raise KilnError(f"{where}={value!r} is not {wanted}",
                        f"set it to {wanted} (or remove it for the default)")
    return value


def _positive(value: str, whole: bool) -> bool:
    try:
        number = int(value) if whole else float(value)
    except ValueError:
        return False
    return number > 0


# Note: a kernel's tuning is keyed by the GPU it ran on, and on a cluster that is the nodes' GPU,
# which this host cannot see (it may have none, or another) and must know before it submits:
# the keys decide what is a miss. So the settings name it, and a node with another GPU refuses.
def tuning_gpu(settings: Mapping[str, str]) -> tuple[str, str] | None:
    """(model, arch) of the GPU the cuda target tunes on, where the executor is not this host."""
    if settings.get("kind") != SLURM:
        return None
    if not settings.get("gpu") or not settings.get("arch"):
        raise KilnError("the slurm executor tunes the cuda target on the nodes' GPU, and kiln must know "
                        "which before it submits (the GPU keys each kernel's tuning)",
                        'set gpu = "NVIDIA H200" and arch = "sm_90" in the config\'s [executor] table '
                        "(or KILN_SLURM_GPU and KILN_SLURM_ARCH), as "
                        "nvidia-smi --query-gpu=name,compute_cap names the nodes' GPU")
    return settings["gpu"], settings["arch"]


def from_table(table: Mapping[str, Any], where: str) -> dict[str, str]:
    """A config's [executor] table as settings: TOML numbers and booleans become their text."""
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise KilnError(f"{where}: unknown key(s) {', '.join(unknown)} in [executor]",
                        f"known: {', '.join(KEYS)}")
    settings: dict[str, str] = {}
    for name, value in table.items():
        if isinstance(value, bool):
            text = "1" if value else "0"
        elif isinstance(value, (int, float, str)):
            text = str(value)
        else:
            raise KilnError(f"{where}: executor.{name} must be a string or a number, got {value!r}")
        at = f"{where}: executor.{name}"
        settings[name] = check_kind(text, at) if name == "kind" else check_setting(name, text, at)
    return settings


def resolve(flag: str | None, configured: Mapping[str, str]) -> dict[str, str]:
    """The settings a build runs with: "kind", and for slurm the job settings that are set."""
    env_kind = os.environ.get("KILN_EXECUTOR", "")
    kind = flag or (check_kind(env_kind, "KILN_EXECUTOR") if env_kind else "") \
        or configured.get("kind", "") or LOCAL
    settings = {"kind": check_kind(kind, "--executor")}
    if kind == SLURM:
        for name in SLURM_SETTINGS:
            variable = f"KILN_SLURM_{name.upper()}"
            value = os.environ.get(variable, "")
            if value:
                settings[name] = check_setting(name, value, variable)
            elif name in configured:
                settings[name] = configured[name]
    return settings
