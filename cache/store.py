"""The artifact store: content-checked entries, one folder each, readable by people.

Layout under the cache root:
    objects/<stage>/<key>/      the artifacts (named by type: program.json, model.so, ...)
                                and meta.json (key parts, artifact digests, timings)
    tmp/                        entries being written; renamed into objects/ when complete
Entries are written to tmp/ first and renamed into place, so a reader never sees half an
entry and a killed writer leaves only a tmp folder that `clean_tmp` removes.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cache.hashing import digest_file, pretty_json
from cache.leases import Lease

META = "meta.json"
_STAMPS = ".verified.json"


class CorruptEntry(Exception):
    """An entry whose files no longer match the digests recorded when it was written."""


@dataclass(frozen=True, slots=True)
class Artifact:
    name: str
    digest: str
    size: int


@dataclass(frozen=True, slots=True)
class Entry:
    stage: str
    key: str
    path: Path
    artifacts: Mapping[str, Artifact]
    meta: Mapping[str, Any]

    def file(self, name: str) -> Path:
        if name not in self.artifacts:
            raise KeyError(f"{self.stage} entry {self.key[:12]} has no artifact {name!r}")
        return self.path / name

    @property
    def size(self) -> int:
        return sum(a.size for a in self.artifacts.values())


Warn = Callable[[str], None]


class Store:
    def __init__(self, root: Path, warn: Warn | None = None, lease: Lease | None = None) -> None:
        # Note: absolute, because stages run compilers in folders of their own: a relative
        # cache folder (kiln.compile(cache_dir="build/cache")) would name a path from there.
        root = root.absolute()
        self.root = root
        self.objects = root / "objects"
        self.tmp = root / "tmp"
        self.warn: Warn = warn or (lambda _msg: None)
        self.lease = lease  # a running compile's hold on what it reads and writes (cache/leases.py)

    def hold(self, stage: str, key: str) -> None:
        """Lease (stage, key) to this compile, so gc and clear leave it alone."""
        if self.lease is not None:
            self.lease.hold(f"{stage}/{key}")

    def entry_path(self, stage: str, key: str) -> Path:
        return self.objects / stage / key

    def lookup(self, stage: str, key: str) -> Entry | None:
        """The entry for (stage, key), verified; None if missing or corrupt (which is removed)."""
        self.hold(stage, key)
        path = self.entry_path(stage, key)
        if not path.is_dir():
            return None
        try:
            entry = _read_entry(stage, key, path)
            _verify(entry)
        except CorruptEntry as err:
            self.warn(f"cache entry {stage}/{key[:12]} is corrupt ({err}); recomputing it")
            self.remove(stage, key)
            return None
        return entry

    @contextmanager
    def staging(self, stage: str, key: str) -> Iterator[Path]:
        """A fresh folder to write an entry into; removed if the block fails."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        path = self.tmp / f"{stage}-{key[:16]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        path.mkdir()
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def commit(self, staged: Path, stage: str, key: str, meta: Mapping[str, Any],
               artifacts: Mapping[str, Artifact] | None = None) -> Entry:
        """Seal a staged folder as the entry for (stage, key) and move it into place; `artifacts`
        where the caller has just scanned it (scan_artifacts)."""
        artifacts = dict(artifacts) if artifacts is not None else scan_artifacts(staged)
        record = {**meta, "stage": stage, "key": key, "artifacts": _artifact_json(artifacts)}
        (staged / META).write_text(pretty_json(record))
        for name in artifacts:
            _make_read_only(staged / name)
        final = self.entry_path(stage, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        self.hold(stage, key)
        try:
            os.rename(staged, final)
        except OSError:
            # Note: someone committed the same key first (possible only without the key lock);
            # their entry has the same content by construction, so keep theirs.
            existing = self.lookup(stage, key)
            if existing is None:
                raise
            return existing
        entry = Entry(stage, key, final, artifacts, record)
        _write_stamps(entry)
        return entry

    def remove(self, stage: str, key: str) -> None:
        """Remove an entry atomically: rename it out of objects/ first, then delete it."""
        doomed = self.move_out(stage, key)
        if doomed is not None:
            shutil.rmtree(doomed, ignore_errors=True)

    def move_out(self, stage: str, key: str) -> Path | None:
        """Rename an entry out of objects/ into tmp/ (where clean_tmp finds it should the caller
        die before deleting it); returns where it went, or None if it was not there."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        doomed = self.tmp / f"removed-{stage}-{key[:16]}-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(self.entry_path(stage, key), doomed)
        except FileNotFoundError:
            return None
        return doomed

    def entries(self) -> Iterator[tuple[str, str, Path]]:
        for stage_dir in _listing(self.objects):
            for path in _listing(stage_dir):
                yield stage_dir.name, path.name, path

    def clean_tmp(self) -> int:
        """Remove staging folders left by processes that no longer run; returns how many."""
        if not self.tmp.is_dir():
            return 0
        removed = 0
        for path in self.tmp.iterdir():
            if not _owner_alive(path.name):
                shutil.rmtree(path, ignore_errors=True)
                removed += 1
        return removed


def write_atomic(path: Path, text: str) -> None:
    """Write beside path, then rename over it: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


def _listing(folder: Path) -> list[Path]:
    """A folder's entries, sorted; none if it is gone (a clear or gc beside us)."""
    try:
        return sorted(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def entry_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _owner_alive(name: str) -> bool:
    parts = name.split("-")
    if name.startswith("removed-") or len(parts) < 4 or not parts[-2].isdigit():
        return False
    pid = int(parts[-2])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def scan_artifacts(folder: Path) -> dict[str, Artifact]:
    """A staged folder's files, by name, with their digests and sizes."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != META)
    return {p.relative_to(folder).as_posix(): Artifact(p.relative_to(folder).as_posix(), digest_file(p),
                                                        p.stat().st_size) for p in files}


def _artifact_json(artifacts: Mapping[str, Artifact]) -> dict[str, Any]:
    return {a.name: {"xxh3_128": a.digest, "bytes": a.size} for a in artifacts.values()}


def _read_entry(stage: str, key: str, path: Path) -> Entry:
    try:
        meta = json.loads((path / META).read_text())
        artifacts = {
            name: Artifact(name, info["xxh3_128"], int(info["bytes"]))
            for name, info in meta["artifacts"].items()
        }
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CorruptEntry(f"unreadable {META}: {err}") from err
    if meta.get("key") != key or meta.get("stage") != stage:
        raise CorruptEntry(f"{META} belongs to another key")
    return Entry(stage, key, path, artifacts, meta)


def _make_read_only(path: Path) -> None:
    executable = path.stat().st_mode & stat.S_IXUSR
    path.chmod(0o555 if executable else 0o444)


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _write_stamps(entry: Entry) -> None:
    stamps = {name: _stamp(entry.path / name) for name in entry.artifacts}
    tmp = entry.path / f"{_STAMPS}.{os.getpid()}"
    try:
        tmp.write_text(json.dumps(stamps, sort_keys=True))
        os.replace(tmp, entry.path / _STAMPS)
    except OSError:
        tmp.unlink(missing_ok=True)


def _verify(entry: Entry) -> None:
    """Check every artifact against its digest.

    Note: re-hashing a 400 MB weights file on every no-op compile would cost most of the
    budget, so a file whose (size, mtime, ctime, inode) still match the stamps taken when it
    was last verified is trusted; any write to it, in place or by replacement, changes the
    stamp and forces a full re-hash.
    """
    try:
        stamps = json.loads((entry.path / _STAMPS).read_text())
    except (OSError, ValueError):
        stamps = {}
    rehashed = False
    for name, artifact in entry.artifacts.items():
        path = entry.path / name
        try:
            current = _stamp(path)
        except OSError as err:
            raise CorruptEntry(f"{name} is missing") from err
        if stamps.get(name) == current:
            continue
        if current[0] != artifact.size or digest_file(path) != artifact.digest:
            raise CorruptEntry(f"{name} does not match its checksum")
        rehashed = True
    if rehashed or not stamps:
        _write_stamps(entry)
