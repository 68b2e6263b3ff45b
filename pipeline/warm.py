"""Stage workers started ahead of their stage, their entry module already imported.

Note: every stage runs in a worker process of its own (pipeline/workers.py), and a worker's first
seconds go to imports: lower's are torch's, ~2-3 s. While a stage runs, the runner starts the
next stage's worker, which imports that stage's entry module and waits on its stdin for a
control folder. If the next stage does run, it takes that worker and the imports are already
done; if it is cached or cut off, the worker is killed (it holds no job), having cost some CPU
and no wall time. Only the stages that may start when the running one ends (the next, and the
one after it where the next runs beside the chain, as weights does: pipeline/workers.py's
starting_next): what runs further down is not known until the stages between have run.

A stage's seconds in the report are the time the build waited for it: for a stage that ran in a
worker started ahead, that leaves out the imports done while the stage before it ran.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from contract.config import PROJECT_ROOT
from pipeline import server
from pipeline.stages import Stage
from pipeline.worker import read_line


class Proc(Protocol):
    """A worker process: a Popen, or a worker the stage server forked (ServedProc)."""

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


class ServedProc:
    """A worker forked by the stage server, seen through its connection (pipeline/server.py):
    it ends when it sends its exit status or the connection ends; it is signalled by a pidfd,
    so a pid the kernel has given to another process since is never signalled."""

    def __init__(self, conn: socket.socket, pid: int) -> None:
        """Raises OSError where the worker cannot be signalled (no pidfds here): use none."""
        self.conn, self.pid = conn, pid
        self._status: int | None = None
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # it has ended already
            self._pidfd = None

    @property
    def returncode(self) -> int | None:
        return self._status

    def poll(self) -> int | None:
        return self.wait(0) if self._status is None and self._readable(0) else self._status

    def wait(self, timeout: float | None = None) -> int:
        if self._status is None:
            if not self._readable(timeout):
                raise subprocess.TimeoutExpired("kiln stage worker", timeout or 0)
            line = read_line(self.conn)
            self._status = int(json.loads(line)["exit"]) if line else -signal.SIGKILL
            self._close()
        return self._status

    def send_signal(self, sig: int) -> None:
        if self._status is None and self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, sig)

    def kill(self) -> None:
        """SIGKILL, and the connection ended: a worker still waiting for its control folder
        exits on that alone, and wait() then sees the end."""
        self.send_signal(signal.SIGKILL)
        if self._status is None:
            with contextlib.suppress(OSError):
                self.conn.shutdown(socket.SHUT_RDWR)

    def _readable(self, timeout: float | None) -> bool:
        poller = select.poll()  # not select(): a caller's process may hold fds past 1024
        poller.register(self.conn, select.POLLIN | select.POLLHUP | select.POLLERR)
        return bool(poller.poll(None if timeout is None else int(timeout * 1000)))

    def _close(self) -> None:
        self.conn.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


@dataclass
class WarmWorker:
    proc: Proc
    log: Path  # its stdout and stderr, from its start

    def hand_over(self, control: Path) -> None:
        """Give the worker its control folder; it runs the job there."""
        try:
            if isinstance(self.proc, ServedProc):
                self.proc.conn.sendall(f"{control}\n".encode())
            elif isinstance(self.proc, subprocess.Popen) and self.proc.stdin is not None:
                self.proc.stdin.write(f"{control}\n".encode())
                self.proc.stdin.close()
        except OSError:  # it died just now: its missing result says so, with its log
            pass

    def stop(self) -> None:
        """Kill it: waiting for its imports to end (before it reads its control folder) would
        cost the runner up to their length."""
        self.proc.kill()
        self.proc.wait()
        if isinstance(self.proc, subprocess.Popen) and self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    return env


def start_worker(entry: str, target: str, log: Path, scope: str = "",
                 libraries: Path | None = None) -> WarmWorker:
    """A worker for a stage: forked by this runner's stage server, its imports done; or, where
    there is none ready, a fresh process that imports the stage's entry module while it waits
    (and, for a stage that builds the model, the libraries listed in `libraries`)."""
    env = worker_env()
    request = {"log": str(log), "env": env, "cwd": os.getcwd(), "umask": _umask(), "entry": entry,
               "target": target, "cpus": sorted(os.sched_getaffinity(0))}
    log.touch()  # a served worker appends to it; a crash report reads it either way
    served = server.connect(env, target, scope, request)
    if served is not None:
        try:
            return WarmWorker(ServedProc(*served), log)
        except OSError:
            served[0].close()  # it exits, having touched nothing
    with log.open("wb") as out:
        listed = [str(libraries)] if libraries else []
        cmd = [sys.executable, "-m", "pipeline.worker", "--warm", entry, target, *listed]
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, env=env)
    return WarmWorker(proc, log)


class WarmWorkers:
    """At most one waiting worker per stage, for one build."""

    def __init__(self, target: str, tmp: Path, scope: str = "") -> None:
        """tmp: the store's folder of work in progress; the workers' logs go in a folder there
        that names this process, so the store's gc removes it should this process be killed."""
        self.target, self.scope = target, scope  # scope: the stage server's (pipeline/server.py)
        self._waiting: dict[str, WarmWorker] = {}
        self._logs = tmp / f"warm-logs-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # made when needed
        self.libraries = self._logs / "libraries"  # what its model's stages import (contract/libraries.py)
        self.taken: list[str] = []  # the stages that ran in a worker started ahead (for tests)

    def start(self, stage: Stage) -> None:
        entry = stage.entry_for(self.target)
        if entry is None or stage.name in self._waiting:
            return
        self._logs.mkdir(parents=True, exist_ok=True)
        log = self._logs / f"{stage.name}.log"
        libraries = self.libraries if stage.builds_model else None
        self._waiting[stage.name] = start_worker(entry, self.target, log, self.scope, libraries)

    def take(self, stage: str) -> WarmWorker | None:
        """The stage's waiting worker, if it is still alive; it is the caller's from now on."""
        warm = self._waiting.pop(stage, None)
        if warm is None:
            return None
        if warm.proc.poll() is not None:  # it died while waiting: start a fresh one instead
            warm.stop()
            return None
        self.taken.append(stage)
        return warm

    def keep_only(self, stages: set[str]) -> None:
        """The workers waiting for any other stage exit (it was found in the cache)."""
        for name in [name for name in self._waiting if name not in stages]:
            self._waiting.pop(name).stop()

    def close(self) -> None:
        for name in list(self._waiting):
            self._waiting.pop(name).stop()
        shutil.rmtree(self._logs, ignore_errors=True)
