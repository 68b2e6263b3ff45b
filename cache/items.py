"""Per-item keys inside a stage: fan-out work (one kernel, one tuning run) cached item by item,
so a one-layer edit recomputes only the items whose own key parts changed."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cache.hashing import digest_json
from cache.locks import key_lock
from cache.store import Entry, Store

Compute = Callable[[Path], Mapping[str, Any]]


class ItemCache:
    def __init__(self, store: Store, stage: str) -> None:
        self.store = store
        self.namespace = f"{stage}.items"

    @staticmethod
    def key(parts: Mapping[str, str]) -> str:
        return digest_json(sorted(parts.items()))

    def lookup(self, parts: Mapping[str, str]) -> Entry | None:
        return self.store.lookup(self.namespace, self.key(parts))

    def get_or_compute(self, parts: Mapping[str, str], compute: Compute) -> tuple[Entry, bool]:
        """The item's entry and whether it was a hit. `compute(folder)` writes the item's files
        and returns notes for its meta.json; it runs at most once per key across processes."""
        key = self.key(parts)
        entry = self.store.lookup(self.namespace, key)
        if entry is not None:
            return entry, True
        lock = self.store.root / "locks" / f"{self.namespace}-{key}.lock"
        with key_lock(lock):
            entry = self.store.lookup(self.namespace, key)
            if entry is not None:
                return entry, True
            with self.store.staging(self.namespace, key) as folder:
                notes = compute(folder)
                meta = {"parts": dict(parts), "notes": dict(notes)}
                return self.store.commit(folder, self.namespace, key, meta), False
