"""kiln's stage server: a resident process that has imported every stage's code, and the model's
libraries, and forks each stage worker from itself, so a compile after the first pays no imports.

    python -m pipeline.server TARGET SCOPE   (started by a compile; nobody needs to run it by hand)

Why: a worker's first seconds are imports. Trace's are torch's and the model's libraries' (8.5 s
of a 13.6 s trace of bert-small on 2 cores: `from transformers import BertForMaskedLM` alone
takes 6 s after torch), and a one-layer edit pays them again. Like Gradle's daemon and Bazel's
server, the work that outlives one compile stays resident; like Python's forkserver, each job
runs in a fork of it, so no state of one job leaks into the next.

How a compile uses it (pipeline/warm.py): a runner that needs a worker connects to the server's
socket and sends one JSON line (the worker's log file, the runner's environment). The server
forks; the child says its pid, waits for its control folder's line and runs the stage as
`python -m pipeline.worker` would (pipeline/worker.py: serve_child), then sends its exit status.
The connection is the child's lifeline: when the runner closes it or dies, the child exits.
Where there is no server, or it is busy starting, or it is stale, the runner starts a fresh
worker instead, exactly as without one, and a compile that ran stages starts one for the next.

Note: one server per (python, environment, working folder, target, model code): a worker forked
from it is the worker a fresh `python -m pipeline.worker` started by that runner would be, with
its imports done. The model code (its project and factory, not its config: an edited copy of
a config shares the server) keeps what one model's workers taught the server out of another's:
a library imported for one model could, by its import's side effects on torch, change another's
trace. Only the working folder and the few variables a shell changes between commands
(VOLATILE) are left out of the match, and the child takes the runner's values of those.
Before each fork the server checks every module file it has imported against the size and time
it was imported at: an edit of kiln, or a library upgraded in place, makes it stale, and a
stale server answers no one and exits.

Note: what it imports beyond the stages' own code is learned: a worker appends the library
modules (from site-packages or the standard library, never the model's own folder) that it had
to import itself, and the idle server imports them. The model's own files are never imported
in the server, so an edit of them is always seen.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import importlib
import json
import os
import select
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from contract.config import KILN_PACKAGES, PROJECT_ROOT
from contract.libraries import MODULE_NAME, drew_random, random_state
from pipeline.stages import STAGES
from pipeline.worker import read_line, serve_child

IDLE_S = 900.0  # an unused server exits after this (KILN_SERVER_IDLE_S)
MAX_SERVERS = 4  # a user's servers at once: a compile starts no fifth
VOLATILE = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "COLUMNS", "LINES"})
_REPLY_TIMEOUT_S = 2.0
# Note: a compile asks for its workers in a burst; the server imports what they learned only once
# none has been asked for a while, so its imports neither delay a request nor share the cores with
# the compile that asked.
_LEARN_AFTER_S = 5.0
_MAX_FOLDER_CHARS = 70  # a socket's path: the folder, a 24-character name and ".sock", under 108 bytes


def enabled(env: Mapping[str, str]) -> bool:
    """Whether this runner may use a server: not where KILN_SERVER=0.

    Note: on a GPU machine a served worker once failed in torch.export with "Cannot re-initialize
    CUDA in forked subprocess", the CPU target too, though torch.cuda.is_initialized() was false
    in the server: an import in it had asked torch.cuda.is_available(), which calls
    cudaGetDeviceCount and marks every later fork as unable to use CUDA. So a server imports
    with PYTORCH_NVML_BASED_CUDA_CHECK=1 (torch then asks NVML, which marks nothing), and serves
    only while a probe fork finds it can use CUDA (forks_lose_cuda). Measured on an H100 with
    torch 2.11: after `import transformers, torchvision` and torch.cuda.is_available(), a fork
    failed to use CUDA without the variable and ran a CUDA op with it.
    """
    return env.get("KILN_SERVER", "1") != "0"


def folder() -> Path | None:
    """This user's folder of server sockets (short: a socket's path has a 108-byte limit), or
    None where it is not safely this user's alone."""
    path = Path(tempfile.gettempdir()) / f"kiln-servers-{os.getuid()}"
    try:
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        info = path.lstat()
    except OSError:  # a TMPDIR we may not write: no server, never a failed compile
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None
    return path if len(str(path)) < _MAX_FOLDER_CHARS else None


def server_name(env: Mapping[str, str], cwd: str, target: str, scope: str) -> str:
    """The name of the server that may serve a runner with this environment, folder, target and
    model code (scope: the model's project and factory)."""
    kept = sorted((k, v) for k, v in env.items() if k not in VOLATILE)
    blob = json.dumps([sys.executable, cwd, target, scope, kept])
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def connect(env: Mapping[str, str], target: str, scope: str,
            request: Mapping[str, object]) -> tuple[socket.socket, int] | None:
    """A worker forked by this runner's server, as (its connection, its pid); None where there
    is no server ready for this runner (then the runner starts a fresh worker)."""
    place = folder() if enabled(env) else None
    if place is None:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(_REPLY_TIMEOUT_S)
        conn.connect(str(place / f"{server_name(env, os.getcwd(), target, scope)}.sock"))
        conn.sendall(json.dumps(dict(request)).encode() + b"\n")
        reply = json.loads(read_line(conn) or "{}")
        pid = int(reply["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        conn.close()
        return None
    conn.settimeout(None)
    return conn, pid


def learn_file(env: Mapping[str, str], target: str, scope: str) -> Path | None:
    """Where this runner's workers list the library modules they imported, for its server."""
    place = folder() if enabled(env) else None
    return None if place is None else place / f"{server_name(env, os.getcwd(), target, scope)}.learn"


def start(env: Mapping[str, str], target: str, scope: str) -> None:
    """Start this runner's server in the background, unless it runs already (or is starting),
    or this user has MAX_SERVERS running already (each holds its imports: about 1 GB)."""
    place = folder() if enabled(env) else None
    if place is None:
        return
    name = server_name(env, os.getcwd(), target, scope)
    if _running(place / f"{name}.lock"):
        return
    if sum(_running(lock) for lock in place.glob("*.lock")) >= MAX_SERVERS:
        return
    with contextlib.suppress(OSError), (place / f"{name}.log").open("ab") as log:  # never fails a build
        subprocess.Popen([sys.executable, "-m", "pipeline.server", target, scope], env=dict(env),
                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)


def _running(lock: Path) -> bool:
    """Whether a server holds this lock (it holds it from its start to its exit)."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return True  # can't tell: start none
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


# -- the server ---------------------------------------------------------------------------------


class Server:
    def __init__(self, target: str, scope: str, place: Path) -> None:
        self.target = target
        self.name = server_name(os.environ, os.getcwd(), target, scope)
        self.sock_path = place / f"{self.name}.sock"
        self.learned = place / f"{self.name}.learn"
        self.denied = place / f"{self.name}.deny"  # learned modules a server must not import
        self.busy = place / f"{self.name}.busy"  # held while it imports: stages that time code wait
        self.files: dict[str, tuple[int, ...]] = {}  # each imported module's file, as it was imported
        self.failed: set[str] = set()
        self.unusable = ""  # why this process may serve no more, once something made it so
        self.children: set[int] = set()
        self.keep_fds: list[int] = []  # the server's own (its lock): closed in every child
        self.idle_s = float(os.environ.get("KILN_SERVER_IDLE_S", IDLE_S))
        # Note: kiln's own files are stamped before anything is imported: a file saved while the
        # server imports it must make it stale, not be recorded as what it runs.
        self.before = {str(path): stamp for path in _kiln_sources() if (stamp := _stamp(str(path)))}

    def preload(self) -> None:
        """Every stage's entry for the target, what its preload(target) imports, and what
        workers have learned."""
        with _held(self.busy):
            for stage in STAGES:
                entry = stage.entry_for(self.target) if stage.built_for(self.target) else None
                if entry is not None:
                    module = importlib.import_module(entry.partition(":")[0])
                    getattr(module, "preload", lambda target: None)(self.target)
            self._learn()

    def learn(self) -> None:
        with _held(self.busy):
            self._learn()

    def _learn(self) -> None:
        """Import the library modules workers had to import themselves, in the order they did.
        One whose import fails, starts a thread, starts CUDA or draws from torch's generator
        (contract/libraries.py: drew_random) is denied to every later server,
        and this one serves no more: what it left behind cannot be undone."""
        self.failed |= set(_words(self.denied))
        for name in dict.fromkeys(_words(self.learned)):
            if name in sys.modules or name in self.failed or not MODULE_NAME.fullmatch(name):
                continue
            state = random_state()
            try:
                importlib.import_module(name)
                why = "" if threading.active_count() == 1 and not forks_lose_cuda() else "a thread or CUDA"
                why = why or ("a draw from torch's random generator" if drew_random(state) else "")
            except (Exception, SystemExit) as err:  # a library's import may raise anything
                why = f"{type(err).__name__}"
            if why:
                self.unusable = f"importing {name}: {why}"
                with contextlib.suppress(OSError), self.denied.open("a") as out:
                    out.write(f"{name}\n")
                return
        self._record_files()

    def _record_files(self) -> None:
        for module in list(sys.modules.values()):
            path = getattr(module, "__file__", None)
            if isinstance(path, str) and path not in self.files:
                stamp = self.before.get(path) or _stamp(path)
                if stamp:
                    self.files[path] = stamp

    def stale(self) -> bool:
        return any(_stamp(path) != seen for path, seen in self.files.items())

    def serve(self) -> int:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            self.sock_path.unlink()  # a dead server's: we hold the lock
        listener.bind(str(self.sock_path))
        listener.listen(64)
        inode = self.sock_path.stat().st_ino
        last = time.monotonic()
        try:
            while not self.unusable:
                ready, _, _ = select.select([listener], [], [], 1.0)
                self._reap()
                if not ready:
                    quiet = time.monotonic() - last
                    if quiet > self.idle_s or not _still_ours(self.sock_path, inode):
                        return 0
                    # Note: only with no worker of its own running, so its imports never share
                    # the cores with a stage, least of all one that times code.
                    if quiet > _LEARN_AFTER_S and not self.children:
                        self.learn()
                    continue
                conn, _ = listener.accept()
                last = time.monotonic()
                if self.stale() or threading.active_count() > 1 or cuda_started():  # see main()
                    conn.close()
                    return 0
                self._fork(listener, conn)
            return 0
        finally:
            if _still_ours(self.sock_path, inode):
                self.sock_path.unlink()

    def _reap(self) -> None:
        for pid in list(self.children):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            self.children.discard(pid)

    def _fork(self, listener: socket.socket, conn: socket.socket) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        gc.freeze()  # see main(): what the server holds is never the child's to collect
        pid = os.fork()
        if pid == 0:
            gc.enable()
            listener.close()
            for fd in self.keep_fds:
                os.close(fd)
            code = 1
            try:
                code = serve_child(conn)
            finally:
                os._exit(code)
        self.children.add(pid)
        conn.close()


def wait_quiet(env: Mapping[str, str], target: str, scope: str, limit_s: float = 60.0) -> None:
    """Wait (up to limit_s) while this runner's server imports, before a stage that times code."""
    place = folder() if enabled(env) else None
    if place is None:
        return
    busy = place / f"{server_name(env, os.getcwd(), target, scope)}.busy"
    if not busy.exists():
        return
    deadline = time.monotonic() + limit_s
    with contextlib.suppress(OSError), busy.open("rb") as held:
        while time.monotonic() < deadline:
            try:
                fcntl.flock(held, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                time.sleep(0.1)


@contextlib.contextmanager
def _held(path: Path) -> Iterator[None]:
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _stamp(path: str) -> tuple[int, ...] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


def _kiln_sources() -> list[Path]:
    return [path for package in KILN_PACKAGES for path in (PROJECT_ROOT / package).rglob("*.py")]


def cuda_started() -> bool:
    """Whether torch has started CUDA in this process (then no fork of it may use CUDA)."""
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    try:
        return bool(cuda is not None and cuda.is_initialized())
    except Exception:  # a torch that cannot say: assume the worst
        return True


def forks_lose_cuda() -> bool:
    """Whether a fork of this process could not use CUDA: torch started it here, or something
    asked the driver for its devices, which marks every later fork (seen from a probe fork)."""
    if cuda_started():
        return True
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    if cuda is None:
        return False
    try:
        pid = os.fork()
    except OSError:
        return True
    if pid == 0:
        code = 1
        try:
            code = 1 if cuda._is_in_bad_fork() else 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status != 0


def _words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def _still_ours(path: Path, inode: int) -> bool:
    try:
        return path.stat().st_ino == inode
    except OSError:
        return False


def main(argv: list[str]) -> int:
    target, scope = argv[0], argv[1]
    place = folder()
    if place is None:
        return 0
    name = server_name(os.environ, os.getcwd(), target, scope)
    lock = os.open(place / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    if not _lock_soon(lock):
        return 0  # another server for this runner is starting or running
    # Note: the collector is off here and its objects frozen before each fork (_fork); each
    # worker turns it back on. A worker's first full collection otherwise walked every object
    # of the server's imports (torch, transformers), writing to their pages, which the fork
    # then copied: 0.35 s of each served stage's 0.45 s (bert-small's schedule here); gc.freeze
    # is made for this (Python's docs, gc.freeze).
    gc.disable()
    server = Server(target, scope, place)
    server.keep_fds.append(lock)
    # Note: set after the server's name is made (the runner's environment has no such variable),
    # so that no import here marks the forks as unable to use CUDA (see enabled).
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    server.preload()
    if forks_lose_cuda():
        # Note: a process that has started CUDA, or asked the driver for its devices, cannot give
        # it to a fork ("Cannot re-initialize CUDA in forked subprocess"): a server serves only
        # while nothing it imported has.
        print("kiln server: not serving: an import started CUDA or marked its forks", file=sys.stderr)
        return 0
    if threading.active_count() > 1:
        # Note: a fork copies only the forking thread, so a Python thread (holding the GIL or a
        # lock at the fork) could leave the child stuck. Native pools started by imports (an
        # idle OpenBLAS pool, torch's) are what DataLoader's fork-based workers live with too.
        print("kiln server: not serving: an import started a Python thread", file=sys.stderr)
        return 0
    code = server.serve()
    if server.unusable:
        print(f"kiln server: stopped serving: {server.unusable}", file=sys.stderr)
    return code


def _lock_soon(fd: int, tries: int = 10) -> bool:
    """The lock, unless another holds it for a second: a runner probing it (start) holds it
    for a moment."""
    for _ in range(tries):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            time.sleep(0.1)
    return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
