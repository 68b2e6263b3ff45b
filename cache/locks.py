"""Per-key file locks, so two processes never compute the same key twice.

Note: flock locks belong to an open file description and the kernel drops them when the
process dies, kill -9 included, so a crashed compile never leaves a lock that blocks a rerun.
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
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
