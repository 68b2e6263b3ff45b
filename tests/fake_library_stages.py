"""Stand-in stages: two for the libraries one stage's worker tells another's (contract/libraries.py):
`lists` imports a library as trace does while it builds the model; `takes` (as weights) says
whether that library was imported in its worker before its job came."""

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
MODEL_LIBRARIES = True  # a worker waiting for `takes` imports what `lists` lists


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
    Stage("takes", "", reads=("lists/lists.txt",), entry="tests.fake_library_stages:takes"),
)


def collector(job: StageJob) -> Mapping[str, Any]:
    """The state of Python's garbage collector in the worker that runs it."""
    import gc

    return {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}
