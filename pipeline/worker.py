"""The worker process that runs one stage: `python -m pipeline.worker CONTROL_DIR`, or
`python -m pipeline.worker --warm ENTRY TARGET`, which imports first and reads CONTROL_DIR from stdin.

It reads CONTROL_DIR/job.json, runs the stage and writes CONTROL_DIR/result.json: the stage's
notes and peak RSS, or the error (a KilnError's message and hint, or an internal error with
its traceback for --debug)."""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import resource
import signal
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from contract.errors import KilnError
from contract.job import StageJob

StageFn = Callable[[StageJob], Mapping[str, Any]]

_PR_SET_PDEATHSIG = 1


def load_entry(entry: str) -> StageFn:
    module_name, fn_name = entry.split(":")
    module = importlib.import_module(module_name)  # codedeps: a stage's entry, in that stage's key
    return cast(StageFn, getattr(module, fn_name))


def peak_rss_self() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this worker when the runner dies (kill -9 included)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the runner died before we asked
        sys.exit(1)


def main(control: Path) -> int:
    _die_with_parent()
    job = StageJob.from_json((control / "job.json").read_text())
    if job.project_root not in sys.path:
        # Note: after kiln's own packages: an in-memory model's root is the folder of the user's
        # file, where a cache.py or tasks/ of theirs must not shadow kiln's.
        sys.path.append(job.project_root)
    try:
        notes = dict(load_entry(job.entry)(job))
        result = {"ok": True, "notes": notes, "peak_rss": peak_rss_self(), "warnings": job.warnings}
    except KilnError as err:
        result = {"ok": False, "error": {**err.to_json(), "detail": err.detail}}
    except Exception as err:
        detail = traceback.format_exc()
        message = f"internal error in stage {job.stage}: {type(err).__name__}: {err}"
        result = {"ok": False, "error": {"message": message, "detail": detail}}
    tmp = control / "result.json.tmp"
    tmp.write_text(json.dumps(result, sort_keys=True))
    tmp.replace(control / "result.json")
    return 0 if result["ok"] else 1


def warm_main(entry: str, target: str) -> int:
    """Import the stage's entry module (and what its `preload(target)` imports, if it has one),
    then run the job whose control folder arrives on stdin; exit when stdin closes first (see
    pipeline/warm.py)."""
    _die_with_parent()
    try:
        module = importlib.import_module(entry.partition(":")[0])  # codedeps: the stage's entry
        getattr(module, "preload", lambda target: None)(target)
        imported = True
    except Exception:
        imported = False
    control = sys.stdin.readline().strip()
    if not control:
        return 0
    if not imported:
        # Note: a fresh process, not a second import in this one: modules a failed import left
        # half-made would give a different, misleading error from the one the stage must report.
        os.execv(sys.executable, [sys.executable, "-m", "pipeline.worker", control])
    return main(Path(control))


if __name__ == "__main__":
    if sys.argv[1] == "--warm":
        sys.exit(warm_main(sys.argv[2], sys.argv[3]))
    sys.exit(main(Path(sys.argv[1])))
