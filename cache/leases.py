"""Leases: what running compiles hold, so that gc and clear never delete it under them.

A compile opens a lease (a file under leases/, named by its pid, that it keeps locked for as
long as it runs) and, before it looks up or commits an entry, appends the entry's name to it.
Its worker processes append to the same file (they are handed its path). gc and clear read the
leases and delete only what no live lease names; a lease whose lock nobody holds belongs to a
process that has died, and is removed.

Note: the append and gc's read-then-delete both happen under one short mutex (a flock), which
orders them: either the entry was leased before gc looked, and gc keeps it, or gc moved it away
first, and the compile's lookup misses and recomputes it. Neither sees half of the other. The
mutex is held for microseconds by a compile and for one pass of renames by gc, never for a whole
compile, so neither starves the other.
"""

from __future__ import annotations

import fcntl
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_MUTEX = ".mutex"
_SUFFIX = ".lease"


def leases_dir(store_root: Path) -> Path:
    return store_root / "leases"


@contextmanager
def store_mutex(store_root: Path) -> Iterator[None]:
    """The short lock that orders lease appends against gc's and clear's deletions."""
    folder = leases_dir(store_root)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / _MUTEX, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class Lease:
    """One compile's hold on the entries it reads and writes."""

    def __init__(self, path: Path, fd: int | None = None) -> None:
        self.path = path
        self._fd = fd  # the owner's locked descriptor; None in a worker that appends to it
        self._held: set[str] = set()

    @classmethod
    def open(cls, store_root: Path) -> Lease:
        """A new lease for this process, locked until `close` (or the process's death)."""
        with store_mutex(store_root):
            path = leases_dir(store_root) / f"{os.getpid()}-{uuid.uuid4().hex[:8]}{_SUFFIX}"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
        return cls(path, fd)

    @classmethod
    def join(cls, path: str | Path) -> Lease:
        """The lease of the compile this worker runs for."""
        return cls(Path(path))

    def hold(self, name: str) -> None:
        """Add "stage/key" to the lease before it is looked up or committed."""
        if name in self._held:
            return
        with store_mutex(self.path.parent.parent), open(self.path, "a") as f:
            f.write(name + "\n")
        self._held.add(name)

    def close(self) -> None:
        if self._fd is None:
            return
        os.close(self._fd)
        self._fd = None
        self.path.unlink(missing_ok=True)


@dataclass(frozen=True)
class LiveLeases:
    held: frozenset[str]  # every "stage/key" a live lease names
    owners: tuple[int, ...]  # the pids holding live leases


def read_leases(store_root: Path) -> LiveLeases:
    """What live leases hold; leases of dead processes are removed. Call under store_mutex."""
    folder = leases_dir(store_root)
    held: set[str] = set()
    owners: list[int] = []
    if not folder.is_dir():
        return LiveLeases(frozenset(), ())
    for path in sorted(folder.glob(f"*{_SUFFIX}")):
        if not _alive(path):
            path.unlink(missing_ok=True)
            continue
        try:
            held.update(line for line in path.read_text().splitlines() if line)
        except OSError:
            continue
        owners.append(int(path.name.split("-", 1)[0]))
    return LiveLeases(frozenset(held), tuple(owners))


def _alive(path: Path) -> bool:
    """Whether some process holds the lease's lock (its owner runs)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
