"""kiln's on-disk cache: content hashing, the artifact store, small records and locks."""

from cache.hashing import canonical_json, digest_bytes, digest_file, digest_json
from cache.locks import key_lock
from cache.records import Records
from cache.store import Artifact, CorruptEntry, Entry, Store

__all__ = [
    "Artifact",
    "CorruptEntry",
    "Entry",
    "Records",
    "Store",
    "canonical_json",
    "digest_bytes",
    "digest_file",
    "digest_json",
    "key_lock",
]
