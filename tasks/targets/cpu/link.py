"""What the cpu target links into model.so: each kernel's winning variant, compiled by autotune."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from contract.job import StageJob
from tasks.link.stage import run_with


def run(job: StageJob) -> Mapping[str, Any]:
    """The cpu target's link entry."""
    return run_with(job, kernel_objects)


def kernel_objects(tuned: Path, keys: list[str], cxx: str, tmp: Path) -> tuple[list[Path], str]:
    return [tuned / "objects" / f"{key[:16]}.o" for key in keys], f"{len(keys)} kernel objects"
