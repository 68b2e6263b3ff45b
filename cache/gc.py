"""`kiln cache info | clear | gc`: what the cache holds, and trimming it to a size.

gc keeps what the most recent builds use: every entry used by the latest compile of each
model is protected; the rest go least-recently-used first until the cache fits.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

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
        count, size = per_stage.get(stage, (0, 0))
        per_stage[stage] = (count + 1, size + entry_size(path))
    return CacheInfo(per_stage, records.volume())


def clear(root: Path, records: Records) -> None:
    records.clear()
    for sub in ("store",):
        shutil.rmtree(root / sub, ignore_errors=True)


@dataclass(frozen=True)
class GcResult:
    removed: int
    freed: int
    kept_bytes: int
    protected_bytes: int


def gc(store: Store, records: Records, max_size: int) -> GcResult:
    store.clean_tmp()
    protected = {e for _, b in records.items("build") for e in b.get("entries", [])}
    last_use = dict(records.items("use"))
    sized = [(f"{s}/{k}", entry_size(p)) for s, k, p in store.entries()]
    total = sum(size for _, size in sized)
    candidates = sorted(
        (item for item in sized if item[0] not in protected),
        key=lambda item: float(last_use.get(item[0], 0.0)),
    )
    removed = freed = 0
    for name, size in candidates:
        if total - freed <= max_size:
            break
        stage, key = name.split("/", 1)
        store.remove(stage, key)
        records.delete("use", name)
        removed, freed = removed + 1, freed + size
    protected_bytes = sum(size for name, size in sized if name in protected)
    return GcResult(removed, freed, total - freed, protected_bytes)
