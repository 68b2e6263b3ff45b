"""The autotune stage's entry: the cpu or the cuda tuner, by target.

Note: each target's module is imported only when it runs. The CPU tuner imports torch (its
timing harness), which costs a cuda compile's autotune worker ~3 s for nothing: that worker only
drives tune.py's processes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contract.job import StageJob


def run(job: StageJob) -> Mapping[str, Any]:
    if job.env["target"] == "cuda":
        from tasks.autotune import cuda

        return cuda.run(job)
    from tasks.autotune import cpu

    return cpu.run(job)


def preload(target: str) -> None:
    """What a worker started ahead of this stage imports while it waits (pipeline/warm.py)."""
    if target == "cuda":
        from tasks.autotune import cuda  # noqa: F401
    else:
        from tasks.autotune import cpu  # noqa: F401
