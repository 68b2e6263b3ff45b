"""Per-key file locks, so two processes never compute the same key twice.

Note: flock locks belong to an open file description and the kernel drops them when the
process dies, kill -9 included, so a crashed compile never leaves a lock that blocks a rerun.
It leaves the lock's file, which gc removes (remove_orphan_locks); a process that locked a file
gc has just unlinked sees that its file is no longer the one at the path, and locks again.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def key_lock(
    path: Path, on_wait: Callable[[], None] | None = None
) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing). `on_wait` runs once if we block."""
    fd = _lock(path, on_wait)
    try:
        yield
    finally:
        os.close(fd)


def _lock(path: Path, on_wait: Callable[[], None] | None) -> int:
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
                on_wait = None
            fcntl.flock(fd, fcntl.LOCK_EX)
        if _still_at(fd, path):
            return fd
        os.close(fd)  # gc removed the file while we waited for it: lock the new one


def _still_at(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def remove_orphan_locks(folder: Path) -> int:
    """Delete the lock files nobody holds; returns how many."""
    removed = 0
    if not folder.is_dir():
        return 0
    for path in folder.glob("*.lock"):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path.unlink(missing_ok=True)  # while locked: a waiter then finds its file gone
            removed += 1
        except BlockingIOError:
            pass
        finally:
            os.close(fd)
    return removed
