"""The worker process that runs one stage: `python -m pipeline.worker CONTROL_DIR`, or
`python -m pipeline.worker --warm ENTRY TARGET`, which imports first and reads CONTROL_DIR from stdin.

It reads CONTROL_DIR/job.json, runs the stage and writes CONTROL_DIR/result.json: the stage's
notes and peak RSS, or the error (a KilnError's message and hint, or an internal error with
its traceback for --debug)."""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import resource
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn, cast

from contract.errors import KilnError
from contract.job import StageJob
from contract.libraries import append_names, import_shared, library_modules

StageFn = Callable[[StageJob], Mapping[str, Any]]
STAGE_IMPORTS = "stage imports"  # the stage's code and torch, where the worker had not imported them ahead

_PR_SET_PDEATHSIG = 1
_served = False  # this worker was forked by the stage server (serve_child)


def load_entry(entry: str) -> StageFn:
    module_name, fn_name = entry.split(":")
    module = importlib.import_module(module_name)  # codedeps: a stage's entry, in that stage's key
    return cast(StageFn, getattr(module, fn_name))


def run_stage(job: StageJob, waited: float = 0.0) -> dict[str, Any]:
    """The stage's notes; where it says where its seconds went, with the seconds its entry's
    imports cost it: those it waited for a worker importing ahead, and those taken here."""
    started = time.perf_counter()
    stage = load_entry(job.entry)
    imported = waited + time.perf_counter() - started
    notes = dict(stage(job))
    if isinstance(notes.get("seconds"), dict):
        notes["seconds"] = {**notes["seconds"], STAGE_IMPORTS: imported}
    return notes


def stage_peak_rss() -> int:
    """This process's peak RSS, or a finished child's if larger (the stage's tuning program,
    a compiler): a stage's peak is that of the largest process it ran. In process (the
    in-process executor, for tests) the children are every child the engine ever had."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max(own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) * 1024


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
    return run_control(control)


def run_control(control: Path, preloaded: frozenset[str] = frozenset(), waited: float = 0.0) -> int:
    """Run the job in `control` and write its result.json; 0 if the stage ended well. The library
    modules it imported beyond `preloaded` are listed in the job's learn file."""
    job = StageJob.from_json((control / "job.json").read_text())
    if job.project_root not in sys.path:
        # Note: after kiln's own packages: an in-memory model's root is the folder of the user's
        # file, where a cache.py or tasks/ of theirs must not shadow kiln's.
        sys.path.append(job.project_root)
    try:
        notes = run_stage(job, waited)
        result = {"ok": True, "notes": notes, "peak_rss": stage_peak_rss(), "warnings": job.warnings,
                  "served": _served}
    except KilnError as err:
        result = {"ok": False, "error": {**err.to_json(), "detail": err.detail}}
    except Exception as err:
        detail = traceback.format_exc()
        message = f"internal error in stage {job.stage}: {type(err).__name__}: {err}"
        result = {"ok": False, "error": {"message": message, "detail": detail}}
    tmp = control / "result.json.tmp"
    tmp.write_text(json.dumps(result, sort_keys=True))
    tmp.replace(control / "result.json")
    if job.learn_file:
        _append_libraries(Path(job.learn_file), set(sys.modules) - preloaded)
    return 0 if result["ok"] else 1


def warm_main(entry: str, target: str, libraries: str = "") -> int:
    """Import the stage's entry module (and what its `preload(target)` imports, if it has one),
    and the libraries listed in `libraries` meanwhile, if given (a stage that builds the model:
    contract/libraries.py); then run the job whose control folder arrives on stdin; exit when
    stdin closes first (see pipeline/warm.py)."""
    _die_with_parent()
    arrival: dict[str, Any] = {}
    reader = threading.Thread(target=_await_control, args=(arrival,), daemon=True)
    reader.start()
    try:
        module = importlib.import_module(entry.partition(":")[0])  # codedeps: the stage's entry
        getattr(module, "preload", lambda target: None)(target)
        imported = True
    except Exception:
        imported = False
    if imported and libraries:
        imported = import_shared(Path(libraries), lambda: "at" in arrival)
    ready = time.perf_counter()
    reader.join()
    control = str(arrival["line"]).strip()
    if not control:
        return 0
    if not imported:
        # Note: a fresh process, not a second import in this one: modules a failed import left
        # half-made would give a different, misleading error from the one the stage must report.
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", "pipeline.worker", control])
    return run_control(Path(control), waited=max(0.0, ready - float(arrival["at"])))


# Note: the control line is read beside the imports, so the worker knows how long the job waited
# on them: the part of the imports that was not ahead of the stage (report.py's "stage imports").
def _await_control(arrival: dict[str, Any]) -> None:
    arrival["line"] = sys.stdin.readline()
    arrival["at"] = time.perf_counter()


def serve_child(conn: socket.socket) -> int:
    """A worker forked by the stage server (pipeline/server.py), its imports done: it takes the
    runner's request, says its pid, and once the runner sends its control folder becomes the
    worker that runner would have started (its log, environment, folder, umask and CPUs), runs
    the job and sends its exit status. It exits when the connection ends first (the runner
    ended, gave up on it, or killed the stage), having touched nothing."""
    request = json.loads(read_line(conn) or "{}")
    preloaded = frozenset(sys.modules)
    conn.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
    control = read_line(conn)
    if not control:
        return 0
    threading.Thread(target=_lifeline, args=(conn,), daemon=True).start()
    _become(request)
    global _served
    _served = True
    code = run_control(Path(control), preloaded)
    sys.stdout.flush()
    sys.stderr.flush()
    conn.sendall(json.dumps({"exit": code}).encode() + b"\n")
    return code


def _become(request: dict[str, Any]) -> None:
    """The process state a fresh worker of the requesting runner would have."""
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    os.umask(int(request["umask"]))
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, request["cpus"])
    sys.argv = [str(Path(__file__).resolve()), "--warm", request["entry"], request["target"]]


def read_line(conn: socket.socket) -> str:
    """One line from a connection ('' at its end), a byte at a time, so nothing after it is taken."""
    data = bytearray()
    while not data.endswith(b"\n"):
        byte = conn.recv(1)
        if not byte:
            return ""
        data += byte
    return data.decode().strip()


def _lifeline(conn: socket.socket) -> None:
    """The runner sends nothing after the control line: the connection's end is the runner's."""
    with contextlib.suppress(OSError):
        while conn.recv(1):
            pass
    os._exit(1)


def _append_libraries(learned: Path, names: set[str]) -> None:
    """The library modules among `names` that the learn file does not list yet: the server
    imports them when idle. Never the model's own files, nor kiln's (only site-packages and the
    standard library). Appended in one write; a server skips a line it cannot read."""
    with contextlib.suppress(OSError):
        listed = set(learned.read_text().split()) if learned.is_file() else set()
        append_names(learned, [name for name in library_modules(names) if name not in listed])


def exit_now(code: int) -> NoReturn:
    """End the worker at once, its output flushed.

    Note: the runner waits for a worker's exit, and a Python that imported torch and a model's
    libraries takes seconds to tear down (1.5 s after bert's export here), paid by every stage
    on the critical path. By now the stage's result and artifacts are written and closed
    (run_control), and nothing of the worker's is left for a finalizer to do.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)  # what native code printed: os._exit skips C's stdio too
    os._exit(code)


if __name__ == "__main__":
    if sys.argv[1] == "--warm":
        exit_now(warm_main(sys.argv[2], sys.argv[3], *sys.argv[4:5]))
    exit_now(main(Path(sys.argv[1])))
