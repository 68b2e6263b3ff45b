"""`kiln cache info | clear | gc`: what the cache holds, and trimming it to a size.

gc keeps what the most recent builds use: every entry used by the latest compile of each
model is protected (unless asked to trim below them); the rest go least-recently-used first
until the cache fits. Neither gc nor clear ever deletes what a running compile holds
(cache/leases.py).
"""

from __future__ import annotations

import re
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cache.leases import read_leases, store_mutex
from cache.locks import remove_orphan_locks
from cache.records import Records
from cache.store import Store, entry_size

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if m is None:
        raise ValueError(f"cannot read {text!r} as a size (examples: 500M, 2G, 1.5GiB, 4096)")
    return int(float(m[1]) * _UNITS[m[2].upper()])


@dataclass(frozen=True)
class CacheInfo:
    entries: dict[str, tuple[int, int]]  # stage -> (count, bytes)
    records_bytes: int

    @property
    def total(self) -> int:
        return sum(b for _, b in self.entries.values()) + self.records_bytes


def info(store: Store, records: Records) -> CacheInfo:
    per_stage: dict[str, tuple[int, int]] = {}
    for stage, _key, path in store.entries():
        try:
            size = entry_size(path)
        except FileNotFoundError:  # removed by a gc meanwhile
            continue
        count, total = per_stage.get(stage, (0, 0))
        per_stage[stage] = (count + 1, total + size)
    return CacheInfo(per_stage, records.volume())


class CacheBusy(Exception):
    """clear was asked not to wait, and compiles are running."""

    def __init__(self, owners: tuple[int, ...]) -> None:
        super().__init__(f"{len(owners)} compile(s) running (pid {', '.join(map(str, owners))})")
        self.owners = owners


def clear(store: Store, records: Records, on_wait: Callable[[tuple[int, ...]], None] | None = None,
          poll: float = 0.2) -> None:
    """Delete every entry and record once no compile is running. on_wait is told, once, who
    runs; without it, a busy cache raises CacheBusy instead of waiting."""
    told = False
    while True:
        with store_mutex(store.root):
            live = read_leases(store.root)
            if not live.owners:
                doomed = _move_store_aside(store)
                records.clear()
                break
        if on_wait is None:
            raise CacheBusy(live.owners)
        if not told:
            on_wait(live.owners)
            told = True
        time.sleep(poll)
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    remove_damaged_records(records.root)


def _move_store_aside(store: Store) -> list[Path]:
    """Rename the store's folders out of the way (leases/ stays: it holds the mutex)."""
    doomed = []
    for sub in ("objects", "tmp", "locks"):
        path = store.root / sub
        aside = store.root / f".cleared-{sub}-{uuid.uuid4().hex[:8]}"
        try:
            path.rename(aside)
        except FileNotFoundError:
            continue
        doomed.append(aside)
    return doomed


def remove_damaged_records(root: Path) -> None:
    """Damaged records databases moved aside (cache/records.py) are garbage."""
    for path in root.parent.glob(f"{root.name}.damaged-*"):
        shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class GcResult:
    removed: int
    freed: int
    kept_bytes: int
    protected_bytes: int  # what the latest builds use (not counting what was trimmed of it)
    leased_bytes: int  # what running compiles hold
    locks_removed: int


def gc(store: Store, records: Records, max_size: int, include_latest: bool = False) -> GcResult:
    """Trim the store to max_size: entries no latest build uses, least recently used first, then
    (with include_latest) the latest builds' own. Never what a running compile holds."""
    store.clean_tmp()
    for path in store.root.glob(".cleared-*"):
        shutil.rmtree(path, ignore_errors=True)
    remove_damaged_records(records.root)
    latest = {e for _, b in records.items("build") for e in b.get("entries", [])}
    last_use = dict(records.items("use"))
    sized = dict(_sizes(store))
    total = sum(sized.values())

    def lru(names: list[str]) -> list[str]:
        return sorted(names, key=lambda name: float(last_use.get(name, 0.0)))

    order = lru([n for n in sized if n not in latest])
    if include_latest:
        order += lru([n for n in sized if n in latest])
    freed, removed, doomed = 0, [], list[Path]()
    with store_mutex(store.root):
        live = read_leases(store.root)
        for name in order:
            if total - freed <= max_size:
                break
            if name in live.held:
                continue
            stage, key = name.split("/", 1)
            moved = store.move_out(stage, key)
            if moved is not None:
                doomed.append(moved)
                removed.append(name)
                freed += sized[name]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    for name in removed:
        records.delete("use", name)
    locks = remove_orphan_locks(store.root / "locks")
    gone = set(removed)
    return GcResult(len(removed), freed, total - freed,
                    sum(size for name, size in sized.items() if name in latest and name not in gone),
                    sum(size for name, size in sized.items() if name in live.held), locks)


def _sizes(store: Store) -> list[tuple[str, int]]:
    found = []
    for stage, key, path in store.entries():
        try:
            found.append((f"{stage}/{key}", entry_size(path)))
        except FileNotFoundError:
            continue
    return found
