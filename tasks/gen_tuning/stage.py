"""The gen-tuning-code stage: schedule.json -> kernels/, kernels.json and tune.py. Its entry is
the target's (tasks/targets/*/kernels.py), which writes the kernels."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from contract.errors import KilnError
from contract.job import StageJob
from tasks.gen_tuning.spec import KernelsSpec
from tasks.schedule import model


def run_with(job: StageJob, write: Callable[[model.Schedule, Path], KernelsSpec]) -> Mapping[str, Any]:
    """The stage, with the target's writer: write(schedule, out) puts kernels/, kernels.json and
    tune.py into out and returns kernels.json, typed. Each target's gen-tuning-code entry
    (tasks/targets/*/kernels.py) calls this."""
    schedule = model.schedule_from(json.loads(job.input("schedule/schedule.json").read_bytes()))
    spec = write(schedule, job.out_dir)
    variants = sum(len(k.variants) for k in spec.kernels)
    return {"kernels": len(spec.kernels), "variants": variants,
            "summary": f"{len(spec.kernels)} distinct kernels, {variants} variants"}


Entry = TypeVar("Entry")


def written(kernel: model.Kernel, write: Callable[[], Entry]) -> Entry:
    """A kernel's entry, where a writer's refusal (a ValueError) names the kernel and the graph
    nodes it came from instead of ending the compile with a bare traceback."""
    try:
        return write()
    except ValueError as err:
        origins = ", ".join(kernel.origins[:4]) or "?"
        raise KilnError(f"kiln cannot write kernel {kernel.name} (from the graph's {origins}): {err}",
                        "a limit of kiln's kernel writers; please report it with the model") from err
