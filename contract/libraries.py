"""The library modules one stage worker imports, told to another worker as they are imported.

Note: a cold compile starts weights' worker beside trace (pipeline/workers.py: starting_next).
It imports torch, then waits the length of trace for its job; once the job came it imported the
model's libraries (transformers' bert: 3.4 s of a 8 s weights stage here) on the compile's
critical path, since autotune waits for weights. Trace imports the same libraries while it
builds the model, so it lists each one as it comes (`shared_while`), and the waiting worker of
a stage that builds the model (Stage.builds_model) imports them meanwhile (`import_shared`).
Only libraries are told (site-packages and the standard library, as the stage server learns
them): never the model's own files, nor kiln's. A library imported early is the one the stage
would import, as the stage server's workers have theirs (pipeline/server.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

POLL_S = 0.05  # how often the lister looks for new modules, and the importer for new lines
# a dotted module name: a listed or learned line that may be imported
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def library_folders() -> tuple[str, ...]:
    """Where libraries live (site-packages, the standard library): what a server may import."""
    paths = sysconfig.get_paths()
    return tuple(sorted({os.path.realpath(paths[key]) + os.sep for key in ("purelib", "platlib", "stdlib")}))


def library_modules(names: set[str]) -> list[str]:
    """The modules among `names` whose files are in a library folder, in their import order."""
    libraries = library_folders()
    return [name for name, module in sys.modules.copy().items()
            if name in names and os.path.realpath(_file_of(module) or os.devnull).startswith(libraries)]


def _file_of(module: object) -> str | None:
    """A module's file, read from its namespace: never through getattr, which runs the import of
    a lazily loaded module (importlib.util.LazyLoader) in the thread that asks."""
    try:
        found = object.__getattribute__(module, "__dict__").get("__file__")
    except (AttributeError, TypeError):
        return None
    return found if isinstance(found, str) else None


def _initializing(module: object) -> bool:
    """Whether the module's import is still running (it may yet fail)."""
    try:
        spec = object.__getattribute__(module, "__dict__").get("__spec__")
    except (AttributeError, TypeError):
        return False
    return bool(getattr(spec, "_initializing", False))


def random_state() -> bytes:
    """torch's default random generator's state, where torch is imported (b"" where not)."""
    torch = sys.modules.get("torch")
    return b"" if torch is None else bytes(torch.default_generator.get_state().numpy().tobytes())


def drew_random(before: bytes) -> bool:
    """Whether torch's generator moved since `before` (random_state()): an import that drew from it.
    Note: the model is built right after torch.manual_seed, and a library imported first (here, or
    in the stage server) draws before the seed, where a worker that imports it in the factory
    draws after: a warm worker would build other weights than a fresh one."""
    return bool(before) and random_state() != before


def append_names(path: Path, names: list[str]) -> None:
    """Append names, a line each, in one write (a reader takes whole lines only)."""
    if names:
        with contextlib.suppress(OSError), path.open("a") as out:
            out.write("".join(f"{name}\n" for name in names))


@contextlib.contextmanager
def shared_while(path: str) -> Iterator[None]:
    """While the block runs, list each library module it imports in `path` ("": none)."""
    if not path:
        yield
        return
    told = set(sys.modules)
    stop = threading.Event()

    def tell() -> None:
        # Note: a module still being imported is told once its import ends: a guarded import
        # that fails would otherwise make the waiting worker fail it too, and start afresh.
        imported = {name for name, module in sys.modules.copy().items()
                    if name not in told and not _initializing(module)}
        told.update(imported)
        append_names(Path(path), library_modules(imported))

    def tell_quietly() -> None:  # a speed-up only: it never fails the stage
        with contextlib.suppress(Exception):
            tell()

    def watch() -> None:
        while not stop.wait(POLL_S):
            tell_quietly()

    watcher = threading.Thread(target=watch, daemon=True, name="kiln-libraries")
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()
        tell_quietly()


def import_shared(path: Path, arrived: Callable[[], bool]) -> bool:
    """Import the modules listed in `path` as they are listed, until `arrived()` (the worker's
    job came); False where an import failed or drew from torch's generator (the caller then
    starts afresh: a failed import can leave modules half made, and see drew_random)."""
    done = 0
    while not arrived():
        names = _whole_lines(path)[done:]
        for name in names:
            if arrived():
                return True
            done += 1
            if name in sys.modules or not MODULE_NAME.fullmatch(name):
                continue
            state = random_state()
            try:
                __import__(name)  # codedeps: a library trace imported (site-packages, stdlib), never kiln's
                why = "drew from torch's random generator" if drew_random(state) else ""
            except (Exception, SystemExit) as err:  # a library's import may raise anything
                why = f"failed ({type(err).__name__})"
            if why:
                print(f"kiln worker: importing {name} ahead {why}; starting afresh", file=sys.stderr)
                return False
        if not names:
            time.sleep(POLL_S)
    return True


def _whole_lines(path: Path) -> list[str]:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return []
    return [line.strip() for line in text[: text.rfind("\n") + 1].splitlines()]
