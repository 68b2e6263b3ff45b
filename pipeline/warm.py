"""Stage workers started ahead of their stage, their entry module already imported.

Note: every stage runs in a worker process of its own (pipeline/workers.py), and a worker's first
seconds go to imports: lower's are torch's, ~2-3 s. While a stage runs, the runner starts the
next stage's worker, which imports that stage's entry module and waits on its stdin for a
control folder. If the next stage does run, it takes that worker and the imports are already
done; if it is cached or cut off, the worker is killed (it holds no job), having cost some CPU
and no wall time. Only one stage ahead: the chain is linear, and what runs two stages down is
not known until the stage between them has run.

A stage's seconds in the report are the time the build waited for it: for a stage that ran in a
worker started ahead, that leaves out the imports done while the stage before it ran.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from contract.config import PROJECT_ROOT
from pipeline.stages import Stage


@dataclass
class WarmWorker:
    proc: subprocess.Popen[bytes]
    log: Path  # its stdout and stderr, from its start


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    return env


class WarmWorkers:
    """At most one waiting worker per stage, for one build."""

    def __init__(self, target: str, tmp: Path) -> None:
        """tmp: the store's folder of work in progress; the workers' logs go in a folder there
        that names this process, so the store's gc removes it should this process be killed."""
        self.target = target
        self._waiting: dict[str, WarmWorker] = {}
        self._logs = tmp / f"warm-logs-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # made when needed
        self.taken: list[str] = []  # the stages that ran in a worker started ahead (for tests)

    def start(self, stage: Stage) -> None:
        entry = stage.entry_for(self.target)
        if entry is None or stage.name in self._waiting:
            return
        self._logs.mkdir(parents=True, exist_ok=True)
        log = self._logs / f"{stage.name}.log"
        with log.open("wb") as out:
            cmd = [sys.executable, "-m", "pipeline.worker", "--warm", entry, self.target]
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                    env=worker_env())
        self._waiting[stage.name] = WarmWorker(proc, log)

    def take(self, stage: str) -> WarmWorker | None:
        """The stage's waiting worker, if it is still alive; it is the caller's from now on."""
        warm = self._waiting.pop(stage, None)
        if warm is None:
            return None
        if warm.proc.poll() is not None:  # it died while waiting: start a fresh one instead
            _stop(warm)
            return None
        self.taken.append(stage)
        return warm

    def keep_only(self, stages: set[str]) -> None:
        """The workers waiting for any other stage exit (it was found in the cache)."""
        for name in [name for name in self._waiting if name not in stages]:
            _stop(self._waiting.pop(name))

    def close(self) -> None:
        for name in list(self._waiting):
            _stop(self._waiting.pop(name))
        shutil.rmtree(self._logs, ignore_errors=True)


def _stop(warm: WarmWorker) -> None:
    """Kill it: it holds no job and has written nothing, and waiting for its imports to end
    (before it reads stdin) would cost the runner up to their length."""
    warm.proc.kill()
    warm.proc.wait()
    if warm.proc.stdin is not None:
        with contextlib.suppress(OSError):
            warm.proc.stdin.close()
