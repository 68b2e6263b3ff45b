"""Cache items a compile builds ahead of the stage that uses them.

Note: a stage may name a module (Stage.prebuild) for an item that depends on no model: today
link's runtime objects (tasks/link/runtime.py), whose build is the longest part of a cold link.
When a compile first runs a stage and the store lacks such an item for a stage still to come,
the runner starts the module's build in a process of its own, so it runs beside trace (which
leaves cores idle) instead of inside link. The stage still asks for the item the usual way: it
finds it, or waits on the item's key lock while it is being built; it never builds it twice,
and builds it itself should the build ahead have failed. A build ahead is an optimisation only:
nothing that goes wrong in starting one fails a compile. It runs at normal priority, since the
stage that needs it may come to wait on its lock (measured here on 2 cores, a nice of 10 gained
nothing). It is killed, with the compilers it started, and its staging folder removed, when the
compile ends before it does; a compile killed with SIGKILL cannot kill it, and it then finishes
its build (seconds) and exits.
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
from collections.abc import Callable
from dataclasses import dataclass

from cache.store import Store
from pipeline.stages import Stage
from pipeline.warm import worker_env

BUILT = 0  # a prebuild module's exit status when it built its item
FOUND = 3  # ... when it found the item already built (any other status: it failed)


@dataclass
class Running:
    stage: str
    what: str  # the item, as the stage's report row names it
    proc: subprocess.Popen[bytes]


class Prebuilds:
    """The items one compile started building ahead."""

    def __init__(self, store: Store) -> None:
        """The logs go in a folder of the store's tmp that names this process, so the store's gc
        removes it should this process be killed."""
        self.store = store
        self.started = False
        self._running: list[Running] = []
        self._logs = store.tmp / f"prebuild-logs-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # made when needed

    def start(self, stages: tuple[Stage, ...], code: Callable[[Stage], str]) -> None:
        """Start building what these stages (the ones this compile may still run) build ahead and
        the store lacks; once per compile. `code` gives a stage's code digest (its items' key)."""
        if self.started:
            return
        self.started = True
        for stage in stages:
            if stage.prebuild is not None:
                with contextlib.suppress(Exception):  # an optimisation only: the stage builds it
                    self._start(stage, stage.prebuild, code(stage))

    def _start(self, stage: Stage, name: str, code: str) -> None:
        module = importlib.import_module(name)  # codedeps: an item's builder, run by its stage too
        if module.is_cached(self.store, code):
            return
        self._logs.mkdir(parents=True, exist_ok=True)
        with (self._logs / f"{stage.name}.log").open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", name, str(self.store.root), code],
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=worker_env(), start_new_session=True)
        self._running.append(Running(stage.name, str(module.WHAT), proc))

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
        """Kill what is still running (the compile ended first) and remove its staging folder
        (a SIGKILL skips the store's own cleanup); remove the logs."""
        for run in self._running:
            if run.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(run.proc.pid, signal.SIGKILL)
                run.proc.wait()
                self._remove_staging(run.proc.pid)
            else:
                run.proc.wait()
        self._running.clear()
        shutil.rmtree(self._logs, ignore_errors=True)

    def _remove_staging(self, pid: int) -> None:
        """The folders a dead process was writing in the store's tmp ("STAGE-KEY-PID-HEX")."""
        if self.store.tmp.is_dir():
            for path in self.store.tmp.iterdir():
                parts = path.name.split("-")
                if len(parts) >= 4 and parts[-2] == str(pid):
                    shutil.rmtree(path, ignore_errors=True)
