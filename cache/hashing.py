"""Content hashing and canonical JSON: the two things every key and artifact is built from."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import xxhash

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


def digest_data(data: bytes) -> str:
    """The xxh3-128 of bytes in memory: what digest_file gives for a file holding them."""
    return str(xxhash.xxh3_128(data).hexdigest())


def digest_json(value: Any) -> str:
    return digest_bytes(canonical_json(value))


# Note: files are digested with xxh3-128, not sha256: a weights file is hundreds of MB, and its
# digest sits on the path of every compile that writes it, every checkpoint swap (the checkpoint's
# digest is its key) and every load(); sha256 runs at about 0.5 GB/s here, xxh3 at several
# GB/s. The digests guard against damage and tell contents apart, with 128 bits against chance
# collisions; a cache is written by trusted processes, so nothing needs a cryptographic hash.
# Keys (small JSON) stay sha256 (digest_bytes).
def digest_file(path: Path) -> str:
    """The xxh3-128 of a file's bytes, as 32 hex digits."""
    h = xxhash.xxh3_128()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def digest_tree(root: Path, suffixes: tuple[str, ...] = (".py",)) -> str:
    """Digest of every file under root with one of the suffixes, by relative path and content."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in suffixes)
    listing = [[p.relative_to(root).as_posix(), digest_file(p)] for p in files]
    return digest_json(listing)
