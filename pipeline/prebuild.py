"""Cache items a compile builds ahead of the stage that uses them.

Note: a stage may name a module (Stage.prebuild) for an item that depends on no model: today
link's runtime objects (tasks/link/runtime.py), whose build is the longest part of a cold link.
When a compile starts and the store lacks such an item, the runner starts the module's build in
a process of its own, so it runs beside trace (which leaves cores idle) instead of inside link.
The stage still asks for the item the usual way: it finds it, or waits on the item's key lock
while it is being built; it never builds it twice, and builds it itself should the process
ahead have failed. The process is killed, with the compilers it started, when the compile ends
before it does; its unfinished entry is staged in the store's tmp, so nothing is poisoned. A
compile killed with SIGKILL cannot kill it: it then finishes its build (seconds) and exits.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from cache.store import Store
from pipeline.stages import Stage
from pipeline.warm import worker_env

# Note: a build ahead runs at a lower priority: on a machine with few cores it should take the
# cores the compile leaves idle, not slow the stages in its way (trace, lower, or autotune's CPU
# timings, should it still be running then).
_NICE = ("nice", "-n", "10") if shutil.which("nice") else ()
BUILT = 0  # a prebuild module's exit status when it built its item (1: it found it built)


@dataclass
class Running:
    stage: str
    what: str  # the item, as the stage's report row names it
    proc: subprocess.Popen[bytes]
    log: Path


class Prebuilds:
    """The items one compile started building ahead."""

    def __init__(self, store: Store) -> None:
        """The logs go in a folder of the store's tmp that names this process, so the store's gc
        removes it should this process be killed."""
        self.store = store
        self._running: list[Running] = []
        self._logs = store.tmp / f"prebuild-logs-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # made when needed

    def start(self, stages: tuple[Stage, ...], target: str) -> None:
        for stage in stages:
            if stage.prebuild is None or not stage.built_for(target):
                continue
            module = importlib.import_module(stage.prebuild)
            try:
                if module.is_cached(self.store):
                    continue
            except RuntimeError:  # no compiler, say: the stage itself will say so, if it runs
                continue
            self._logs.mkdir(parents=True, exist_ok=True)
            log = self._logs / f"{stage.name}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen([*_NICE, sys.executable, "-m", stage.prebuild, str(self.store.root)],
                                        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        env=worker_env(), start_new_session=True)
            self._running.append(Running(stage.name, str(module.WHAT), proc, log))

    def note(self, stage: str) -> str:
        """What this compile built ahead for the stage, for its row; called once the stage has
        run, when a build ahead has committed its item (or failed, or found it built)."""
        built = []
        for run in self._running:
            if run.stage == stage:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    run.proc.wait(timeout=2)  # past its commit, it is exiting
                if run.proc.returncode == BUILT:
                    built.append(f"{run.what} built ahead")
        return "; ".join(built)

    def close(self) -> None:
        """Kill what is still running (the compile ended first); remove the logs."""
        for run in self._running:
            if run.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(run.proc.pid, signal.SIGKILL)
            run.proc.wait()
        self._running.clear()
        shutil.rmtree(self._logs, ignore_errors=True)
