"""The library modules one stage worker imports, told to another worker as they are imported.

Note: a cold compile starts weights' worker beside trace (pipeline/workers.py: starting_next).
It imports torch, then waits the length of trace for its job; once the job came it imported the
model's libraries (transformers' bert: 3.4 s of a 8 s weights stage here) on the compile's
critical path, since autotune waits for weights. Trace imports the same libraries while it
builds the model, so it lists each one as it comes (`shared_while`), and the waiting worker of
a stage that builds the model imports them meanwhile (`import_shared`). Only libraries are
told (site-packages and the standard library, as the stage server learns them): never the
model's own files, nor kiln's. A library imported early is the one the stage would import, as
the stage server's workers have theirs (pipeline/server.py).
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
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def library_folders() -> tuple[str, ...]:
    """Where libraries live (site-packages, the standard library): what a server may import."""
    paths = sysconfig.get_paths()
    return tuple(sorted({os.path.realpath(paths[key]) + os.sep for key in ("purelib", "platlib", "stdlib")}))


def library_modules(names: set[str]) -> list[str]:
    """The modules among `names` whose files are in a library folder, in their import order."""
    libraries = library_folders()
    found = []
    for name in [n for n in list(sys.modules) if n in names]:
        path = getattr(sys.modules.get(name), "__file__", None)
        if isinstance(path, str) and os.path.realpath(path).startswith(libraries):
            found.append(name)
    return found


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
        new = set(sys.modules) - told
        listed = library_modules(new)
        told.update(new)
        append_names(Path(path), listed)

    def watch() -> None:
        while not stop.wait(POLL_S):
            tell()

    watcher = threading.Thread(target=watch, daemon=True, name="kiln-libraries")
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()
        tell()


def import_shared(path: Path, arrived: Callable[[], bool]) -> bool:
    """Import the modules listed in `path` as they are listed, until `arrived()` (the worker's
    job came); False where an import failed (the caller then starts afresh: a failed import
    can leave modules half made)."""
    done = 0
    while not arrived():
        names = _whole_lines(path)[done:]
        for name in names:
            if arrived():
                return True
            done += 1
            if name in sys.modules or not _MODULE_NAME.fullmatch(name):
                continue
            try:
                __import__(name)
            except (Exception, SystemExit):  # a library's import may raise anything
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
