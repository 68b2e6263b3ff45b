"""Child processes for the benchmarks: their environment, wall time and peak host memory.

Every compile and every latency measurement runs in a fresh process, so nothing is warm and a
native crash costs only that measurement. A worker job (bench/workers.py) writes its result as
JSON to the file named in its spec; a failure becomes {"error": "..."}, never an exception here.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ERROR_CHARS = 2000  # the end of an error message kept in results


def tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-12:])[-ERROR_CHARS:]


def error_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"[-ERROR_CHARS:]


_FATAL = re.compile(r"^Fatal Python error: (.+)$", re.M)
_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (\S+)$')


def _short_path(path: str) -> str:
    """A frame's file as a reader finds it: from the package down, or from kiln's root."""
    _, found, rest = path.rpartition("-packages/")
    if found:
        return rest
    root = f"{ROOT}{os.sep}"
    return path[len(root):] if path.startswith(root) else path


# Note: children run with PYTHONFAULTHANDLER=1 (child_env), so a native crash (AOTInductor's
# package loader died with SIGSEGV on the H200) prints the Python stack of the thread that died.
# Its innermost frame says where the crash was, and the innermost frame of kiln's own code says
# which of kiln's steps called it; the rest of the dump (the other threads, the extension modules)
# would only crowd the table's notes.
def crash_site(text: str) -> str | None:
    """Where a child that faulthandler reported on died: the fatal error, its innermost frame
    and the innermost frame of kiln's code, or None when the text holds no such report."""
    fatal = _FATAL.search(text)
    if fatal is None:
        return None
    _, _, current = text[fatal.end():].partition("Current thread")
    frames = []
    for line in current.splitlines()[1:]:
        frame = _FRAME.match(line)
        if frame is None:
            break
        frames.append((frame.group(1), f"{_short_path(frame.group(1))}:{frame.group(2)} {frame.group(3)}"))
    site = fatal.group(1)
    if frames:
        site += f" in {frames[0][1]}"
        ours = next((name for path, name in frames[1:] if path.startswith(str(ROOT))), None)
        site += f", called from {ours}" if ours else ""
    return site


def python_path() -> str:
    """kiln's root first (configs name `models.mlp:build`), then the caller's PYTHONPATH (the GPU
    machine's carried wheels)."""
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


# Note: inductor keeps its triton kernels under TORCHINDUCTOR_CACHE_DIR unless TRITON_CACHE_DIR
# is set, kiln's autotune uses triton's own cache (~/.triton by default), and AOTInductor's
# precompiled headers go to $TMPDIR/torchinductor_$USER whatever the cache dir: a folder that
# holds all three is cold for every compiler the first time it is used and warm after.
def child_env(folder: Path, threads: int | None = None, tmpdir: Path | None = None) -> dict[str, str]:
    """The environment of a child whose caches (inductor, triton, kiln) and TMPDIR (unless tmpdir
    puts it elsewhere) live in folder."""
    tmpdir = tmpdir or folder / "tmp"
    tmpdir.mkdir(parents=True, exist_ok=True)  # tempfile ignores a TMPDIR that does not exist
    env = dict(os.environ, PYTHONPATH=python_path(), TMPDIR=str(tmpdir), PYTHONFAULTHANDLER="1",
               TORCHINDUCTOR_CACHE_DIR=str(folder / "inductor"), TRITON_CACHE_DIR=str(folder / "triton"),
               KILN_CACHE_DIR=str(folder / "kiln"))
    if threads:
        # Note: compiles get the thread count too, not only latency runs: inductor's C++ codegen
        # bakes torch.get_num_threads() into its parallel loops, and kiln's autotune times kernels
        # with it.
        env["OMP_NUM_THREADS"] = str(threads)
    return env


@dataclass(frozen=True)
class Finished:
    """A child that ran to its end (or was killed at its time limit)."""

    returncode: int
    started: float  # time.monotonic() just before the child was started
    seconds: float
    peak_rss_bytes: int  # the largest RSS of the child or of any descendant it waited for
    output: str  # the end of its stdout and stderr together
    timed_out: bool
    crash: str | None = None  # where a native crash happened (crash_site), if it was reported

    def failure(self, what: str) -> str | None:
        """An error string if the child failed, else None."""
        if self.timed_out:
            return f"{what} timed out after {self.seconds:.0f} s"
        if self.returncode < 0 and self.crash:
            return f"{what} died with {_signal_name(-self.returncode)}: {self.crash}"
        if self.returncode != 0:
            return f"{what} exited {self.returncode}: {self.output}"
        return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# Note: subprocess.run reaps its child with waitpid and drops the child's resource usage;
# os.wait4 returns it for that child alone (RUSAGE_CHILDREN would be the maximum over every
# child this process ever had). Linux folds each waited-for descendant's peak RSS into its
# parent's, so the figure covers a compile's worker processes (kiln's stage workers, inductor's
# compile pool) as well as the process itself.
def run_measured(cmd: list[str], env: dict[str, str], timeout: float) -> Finished:
    """Run cmd in ROOT; its wall time and peak RSS, its output's end, and whether it timed out."""
    killed = threading.Event()
    with tempfile.TemporaryFile() as log:
        started = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)

        def kill() -> None:
            killed.set()
            proc.kill()

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        seconds = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        text = log.read().decode(errors="replace")
    return Finished(proc.returncode, started, round(seconds, 3), usage.ru_maxrss * 1024, tail(text),
                    killed.is_set(), crash_site(text))


# Note: a worker that measures more than one thing (a compile, then the latency of what it
# compiled) writes its result before each later step, naming that step under UNFINISHED. A native
# crash there (a segfault in a loaded package, say) then costs that step's figures only: the step
# gets the crash as its error and the figures before it stand.
UNFINISHED = "unfinished"


def run_worker(spec: dict[str, Any], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run one bench/workers.py job in a fresh process: its result with process_s and
    peak_rss_bytes added, or {"error": ...}."""
    result = Path(spec["result"])
    result.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "bench.workers", json.dumps(spec)]
    done = run_measured(cmd, env, timeout)
    failed = done.failure(f"{spec['task']} worker")
    found: dict[str, Any] = json.loads(result.read_text()) if result.is_file() else {}
    step = found.pop(UNFINISHED, None)
    if step is not None:
        found[step] = {"error": failed or f"{spec['task']} worker stopped in its {step} step: {done.output}"}
    elif failed is not None or not found:
        return {"error": failed or f"{spec['task']} worker wrote no result: {done.output}",
                "process_s": done.seconds}
    found["process_s"] = done.seconds
    found["peak_rss_bytes"] = done.peak_rss_bytes
    if isinstance(found.get("ready_at"), float):
        # Note: time.monotonic() is CLOCK_MONOTONIC, one clock for every process on the machine,
        # so the child's moment "compiled and ready" less this process's moment of starting it
        # is the wall time of a fresh process up to that point.
        found["ready_s"] = round(found.pop("ready_at") - done.started, 3)
    return found


def cpu_name() -> str | None:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else None


def host_facts() -> dict[str, Any]:
    """The machine as this process sees it, without importing torch."""
    import platform
    import shutil

    return {"cpu": cpu_name() or platform.machine(), "cpu_count": os.cpu_count(),
            "affinity": len(os.sched_getaffinity(0)), "cxx": shutil.which("c++"),
            "loadavg_1m": round(os.getloadavg()[0], 2)}
