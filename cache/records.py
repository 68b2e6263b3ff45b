"""Small records beside the store: depfiles, last keys for `explain`, build history for gc.

Note: diskcache keeps these in SQLite, which is transactional and safe across processes,
and costs ~0.03 ms a lookup. Values are stored as canonical JSON text, never pickles, so a
record written by one kiln version reads the same in another.

Records are derived data: losing them costs a recompute at most (a depfile, a code scan) and
never a wrong build, because every stage entry is found by its key and checked by its digests.
So a damaged database is moved aside, with one warning, and a new one is started; no command
stops on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import diskcache

from cache.hashing import canonical_json

T = TypeVar("T")
_DB = "cache.db"
# SQLite's result codes for a damaged file: SQLITE_CORRUPT and SQLITE_NOTADB.
_DAMAGE_CODES = (11, 26)


def is_damage(err: BaseException) -> bool:
    """A database error that says the file is damaged (not busy, not locked, not full)."""
    if not isinstance(err, sqlite3.DatabaseError):
        return False
    code = getattr(err, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in _DAMAGE_CODES
    text = str(err).lower()
    return "malformed" in text or "not a database" in text


class Records:
    def __init__(self, root: Path, warn: Callable[[str], None] | None = None) -> None:
        self.root = root
        self.warn = warn or (lambda _msg: None)
        self._db = self._open()

    def _open(self) -> diskcache.Cache:
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            db = diskcache.Cache(str(self.root), eviction_policy="none", size_limit=2**40)
        except sqlite3.DatabaseError as err:
            if not is_damage(err):
                raise
            self._move_aside(err, None)
            self.root.mkdir(parents=True, exist_ok=True)
            db = diskcache.Cache(str(self.root), eviction_policy="none", size_limit=2**40)
        self._inode = _inode(self.root / _DB)
        return db

    def _move_aside(self, err: BaseException, opened: int | None) -> None:
        """Rename the damaged folder out of the way, unless another process already did (the
        database now there is not the one that failed)."""
        current = _inode(self.root / _DB)
        if opened is None or current == opened:
            aside = self.root.with_name(f"{self.root.name}.damaged-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            try:
                os.rename(self.root, aside)
            except FileNotFoundError:
                return
            self.warn(f"the records database {self.root / _DB} was damaged ({err}); moved it to {aside} "
                      "and started a new one (records are derived: builds are unaffected, and a first "
                      "compile may redo a little work)")

    def _guarded(self, op: Callable[[diskcache.Cache], T]) -> T:
        try:
            return op(self._db)
        except sqlite3.DatabaseError as err:
            if not is_damage(err):
                raise
        # Note: outside the except block, so a second failure does not chain the first.
        self._recover()
        return op(self._db)

    def _recover(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
        opened = self._inode
        try:
            self._move_aside(sqlite3.DatabaseError("database disk image is malformed"), opened)
        finally:
            self._db = self._open()

    def get(self, namespace: str, key: str) -> Any:
        raw = self._guarded(lambda db: db.get(f"{namespace}:{key}"))
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return None

    def set(self, namespace: str, key: str, value: Any) -> None:
        text = canonical_json(value).decode()
        self._guarded(lambda db: db.set(f"{namespace}:{key}", text))

    def delete(self, namespace: str, key: str) -> None:
        self._guarded(lambda db: db.delete(f"{namespace}:{key}"))

    def items(self, namespace: str) -> list[tuple[str, Any]]:
        prefix = f"{namespace}:"
        keys = self._guarded(
            lambda db: [k for k in db.iterkeys() if isinstance(k, str) and k.startswith(prefix)])
        found = []
        for full in keys:
            value = self.get(namespace, full[len(prefix):])
            if value is not None:
                found.append((full[len(prefix):], value))
        return found

    def clear(self) -> None:
        self._guarded(lambda db: db.clear())

    def volume(self) -> int:
        return int(self._guarded(lambda db: db.volume()))

    def close(self) -> None:
        self._db.close()


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None
