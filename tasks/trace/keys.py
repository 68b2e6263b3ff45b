"""The trace stage's dynamic key parts, computed without importing torch or the model.

Like a compiler's depfile: the trace records which of the model's source files it imported
and which packages (with versions) it used. The next compile re-hashes those files and reads
those versions before importing anything; if nothing changed, trace is a cache hit.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cache.hashing import digest_file, digest_json
from cache.records import Records
from contract.facts import package_version
from contract.keys import KeyContext, Parts

DEPFILE = "depfile"


# Note: what a trace imports follows from the model's factory and its arguments, not from the
# config file that names them: a copy of a config with a new checkpoint or seed (as `kiln bench`
# writes) finds the depfile its original recorded, and its trace is a hit.
def depfile_id(ctx: KeyContext) -> str:
    what = [str(ctx.config.project_root), ctx.config.job_value("model.factory"),
            ctx.config.job_value("model.kwargs")]
    return digest_json(what)


def key_parts(ctx: KeyContext) -> Parts | None:
    if ctx.live is not None:
        return None  # traced on every compile, keyed by its program (tasks/trace/live.py)
    parts: Parts = {}
    deps = ctx.records.get(DEPFILE, depfile_id(ctx))
    if deps is None:
        parts["deps"] = "unknown (never traced)"
    else:
        for rel in deps["files"]:
            parts[f"src:{rel}"] = _source_digest(ctx.config.project_root, rel)
        for dist in deps["packages"]:
            parts[f"pkg:{dist}"] = package_version(dist)
    return parts  # no weights: the weights stage reads the checkpoint


def remember(ctx: KeyContext, notes: Mapping[str, Any]) -> None:
    if ctx.live is None and "depfile" in notes:
        ctx.records.set(DEPFILE, depfile_id(ctx), notes["depfile"])


def _source_digest(root: Path, rel: str) -> str:
    path = root / rel
    try:
        return digest_file(path)[:16]
    except OSError:
        return "missing"


_FILE_DIGESTS = "filedigest.xxh3"  # its own namespace: "filedigest" held sha256 digests


def file_digest(path: Path, records: Records) -> str:
    """A file's digest (digest_file), re-hashed only when its stat stamp changed (checkpoints are large)."""
    try:
        st = path.stat()
    except OSError:
        return "missing"
    stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    known = records.get(_FILE_DIGESTS, str(path))
    if known is not None and known.get("stamp") == stamp:
        return str(known["digest"])
    digest = digest_file(path)
    records.set(_FILE_DIGESTS, str(path), {"stamp": stamp, "digest": digest})
    return digest

