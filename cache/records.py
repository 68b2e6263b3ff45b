"""Small records beside the store: depfiles, last keys for `explain`, build history for gc.

Note: diskcache keeps these in SQLite, which is transactional and safe across processes,
and costs ~0.03 ms a lookup. Values are stored as canonical JSON text, never pickles, so a
record written by one kiln version reads the same in another.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import diskcache

from cache.hashing import canonical_json


class Records:
    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self._db = diskcache.Cache(str(root), eviction_policy="none", size_limit=2**40)

    def get(self, namespace: str, key: str) -> Any:
        raw = self._db.get(f"{namespace}:{key}")
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return None

    def set(self, namespace: str, key: str, value: Any) -> None:
        self._db.set(f"{namespace}:{key}", canonical_json(value).decode())

    def delete(self, namespace: str, key: str) -> None:
        self._db.delete(f"{namespace}:{key}")

    def items(self, namespace: str) -> list[tuple[str, Any]]:
        prefix = f"{namespace}:"
        found = []
        for full in self._db.iterkeys():
            if isinstance(full, str) and full.startswith(prefix):
                value = self.get(namespace, full[len(prefix) :])
                if value is not None:
                    found.append((full[len(prefix) :], value))
        return found

    def clear(self) -> None:
        self._db.clear()

    def volume(self) -> int:
        return int(self._db.volume())

    def close(self) -> None:
        self._db.close()
