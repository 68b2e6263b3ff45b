"""Content hashing and canonical JSON: the two things every key and artifact is built from."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def canonical_json(value: Any) -> bytes:
    """JSON with sorted keys, no whitespace and exact floats: equal data gives equal bytes.

    Note: Python's float repr is the shortest string that round-trips, so floats are exact.
    NaN and infinities have no JSON form; we refuse them rather than write non-standard JSON.
    """
    _reject_non_finite(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _reject_non_finite(value: Any) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"canonical JSON cannot hold {value!r}")
    if isinstance(value, dict):
        for item in value.values():
            _reject_non_finite(item)
    elif isinstance(value, list | tuple):
        for item in value:
            _reject_non_finite(item)


def pretty_json(value: Any) -> str:
    """Readable, still deterministic JSON for files people open (meta.json, reports)."""
    return json.dumps(value, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def digest_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest_json(value: Any) -> str:
    return digest_bytes(canonical_json(value))


def digest_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def digest_tree(root: Path, suffixes: tuple[str, ...] = (".py",)) -> str:
    """Digest of every file under root with one of the suffixes, by relative path and content."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in suffixes)
    listing = [[p.relative_to(root).as_posix(), digest_file(p)] for p in files]
    return digest_json(listing)
