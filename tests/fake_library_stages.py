"""Stand-in stages. Two for the libraries one stage's worker tells another's (contract/libraries.py):
`lists` imports a library as trace does while it builds the model; `takes` (as weights) says
whether that library was imported in its worker before its job came. And `collector`, which
says how Python's garbage collector stands in its worker."""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Mapping
from typing import Any

from contract.job import StageJob
from contract.libraries import shared_while
from pipeline.stages import Stage

LIBRARY = "wave"  # a standard library module no kiln worker imports otherwise


def lists(job: StageJob) -> Mapping[str, Any]:
    with shared_while(job.libraries_file):
        importlib.import_module(LIBRARY)
    time.sleep(1.5)  # the waiting worker takes it meanwhile
    (job.out_dir / "lists.txt").write_text("listed\n")
    return {}


def takes(job: StageJob) -> Mapping[str, Any]:
    (job.out_dir / "takes.txt").write_text(f"{LIBRARY in sys.modules}\n")
    return {}


LIBRARY_STAGES: tuple[Stage, ...] = (
    Stage("lists", "", config=("model.kwargs",), entry="tests.fake_library_stages:lists"),
    Stage("takes", "", reads=("lists/lists.txt",), entry="tests.fake_library_stages:takes",
          builds_model=True),
)


def collector(job: StageJob) -> Mapping[str, Any]:
    """The state of Python's garbage collector in the worker that runs it."""
    import gc

    return {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}
