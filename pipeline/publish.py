"""Publishing a build: the stages' published artifacts and the reports, as one folder, swapped
in whole.

The new folder is written beside the old one (`.NAME.publish-PID-HEX`), then exchanged with it
in one rename, so at every instant the build folder holds the old complete build or the new one,
never a mix; a kill at any point leaves only a hidden sibling, which the next publish removes.
Every file is the folder's own bytes: a reflink where the filesystem has them, else a copy; a
file the old folder already holds with the same digest (checked by its stamp) is linked from
there, since the old folder is deleted once the new one is in.

model.json gains a "files" section: the size and xxh3-128 of every published file, and for the
weights the xxh3-128 their header carries, which `load()` and kiln_model_create check.
`.kiln-build.json` keeps each file's digest and stamp, so a no-op compile finds the folder
already whole without reading it.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import shutil
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cache.hashing import pretty_json
from cache.store import Entry, write_atomic
from contract.errors import KilnError
from contract.model_json import FileRecord, ModelJson
from pipeline.integrity import MODEL_JSON, MODEL_SO, WEIGHTS, weights_digest
from pipeline.runner import BuildResult
from pipeline.stages import Stage

STAMPS = ".kiln-build.json"
_FICLONE = 0x40049409  # linux/fs.h: share the source's extents (btrfs, xfs, bcachefs)
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100

Step = Callable[[str], None]  # told each step's name before it runs (the fault suite kills there)


@dataclass(frozen=True)
class Source:
    path: Path  # the cache's file
    digest: str  # xxh3-128 (cache.hashing.digest_file)
    size: int


def publish(result: BuildResult, stages: tuple[Stage, ...], make_reports: Callable[[], Mapping[str, str]],
            on_step: Step | None = None) -> Path:
    """Publish the build and its reports (made once the folder is chosen) into result.out, or,
    for a partial build beside a complete one, into a folder of its own, which it returns and
    sets as result.out."""
    step = on_step or (lambda _name: None)
    files = planned_files(result, stages)
    complete = MODEL_SO in files
    out = result.out
    if not complete and _holds_complete_build(out):
        out = out.with_name(f"{out.name}.partial")
        result.warnings.append(f"{result.out} holds a complete build, left as it is; this partial "
                               f"build's outputs are in {out}")
    result.out = out
    reports = make_reports()
    _check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_litter(out)
    if _already_published(out, files):
        for name, text in reports.items():
            write_atomic(out / name, text)
        return out
    staged = out.with_name(f".{out.name}.publish-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    staged.mkdir()
    try:
        _fill(staged, out, files, reports, step)
        step("swap")
        old = _swap_in(staged, out)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    if old is not None:
        step("remove old")
        shutil.rmtree(old, ignore_errors=True)
    return out


def planned_files(result: BuildResult, stages: tuple[Stage, ...]) -> dict[str, Source]:
    """Each published artifact's relative path in the build folder, and its cache file."""
    files: dict[str, Source] = {}
    for stage in stages:
        entry = result.entries.get(stage.name)
        if entry is None:
            continue
        for name in stage.publish:
            for artifact in _matching(entry, name):
                a = entry.artifacts[artifact]
                files[artifact] = Source(entry.file(artifact), a.digest, a.size)
    return files


def _matching(entry: Entry, name: str) -> list[str]:
    return sorted(a for a in entry.artifacts if a.startswith(name)) if name.endswith("/") else [name]


def _fill(staged: Path, out: Path, files: Mapping[str, Source], reports: Mapping[str, str],
          step: Step) -> None:
    reusable = _verified_files(out)
    stamps: dict[str, Any] = {}
    for name, source in sorted(files.items()):
        step(f"place {name}")
        dst = staged / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if name == MODEL_JSON:
            continue  # written last, with the files section
        if not _link_unchanged(out / name, dst, reusable.get(name), source.digest):
            _copy(source.path, dst)
    if MODEL_JSON in files:
        step("write model.json")
        (staged / MODEL_JSON).write_text(pretty_json(_model_json(files, staged)))
    for name, text in reports.items():
        step(f"write {name}")
        (staged / name).write_text(text)
    step("write stamps")
    for name, source in files.items():
        digest = source.digest if name != MODEL_JSON else ""
        stamps[name] = {"digest": digest, "stamp": _stamp(staged / name)}
    (staged / STAMPS).write_text(json.dumps({"complete": MODEL_SO in files, "files": stamps},
                                            sort_keys=True, indent=1))


def _model_json(files: Mapping[str, Source], staged: Path) -> dict[str, Any]:
    """gen-cpp's model.json with the files section load() checks."""
    model = ModelJson.from_json(json.loads(files[MODEL_JSON].path.read_text()))
    listed = {name: FileRecord(source.size, source.digest,
                               weights_digest(staged / name) if name == WEIGHTS else None)
              for name, source in sorted(files.items()) if name != MODEL_JSON}
    return replace(model, files=listed).to_json()


def _copy(src: Path, dst: Path) -> None:
    """dst as its own bytes: a reflink where the filesystem shares extents, else a copy."""
    with open(src, "rb") as s, open(dst, "wb") as d:
        try:
            fcntl.ioctl(d.fileno(), _FICLONE, s.fileno())
            return
        except OSError:
            pass
    shutil.copyfile(src, dst)
    if os.access(src, os.X_OK):
        dst.chmod(0o755)


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _read_stamps(out: Path) -> dict[str, Any]:
    try:
        data = json.loads((out / STAMPS).read_text())
        return dict(data) if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _verified_files(out: Path) -> dict[str, tuple[str, int]]:
    """The old folder's files whose stamps show them unchanged since publish: name -> (digest,
    inode)."""
    found = {}
    for name, info in _read_stamps(out).get("files", {}).items():
        try:
            stamp = _stamp(out / name)
            if stamp == info["stamp"] and info["digest"]:
                found[name] = (str(info["digest"]), stamp[3])
        except (OSError, KeyError, TypeError):
            continue
    return found


def _link_unchanged(old: Path, dst: Path, verified: tuple[str, int] | None, digest: str) -> bool:
    """Link dst to the old folder's file when that file was verified to hold `digest` (and is
    still the file verified: another compile may have swapped the folder meanwhile)."""
    if verified is None or verified[0] != digest:
        return False
    try:
        os.link(old, dst)
    except OSError:
        return False
    if dst.stat().st_ino == verified[1]:
        return True
    dst.unlink()
    return False


def _already_published(out: Path, files: Mapping[str, Source]) -> bool:
    """Whether out holds exactly these files, unchanged (model.json by its stamp alone)."""
    if not out.is_dir():
        return False  # a build that publishes no file (--until trace) still gets its folder
    recorded = _read_stamps(out).get("files", {})
    if set(recorded) != set(files):
        return False
    verified = _verified_files(out)
    for name, source in files.items():
        if name == MODEL_JSON:
            try:
                if _stamp(out / name) != recorded[name]["stamp"]:
                    return False
            except (OSError, KeyError, TypeError):
                return False
        elif verified.get(name, ("", 0))[0] != source.digest:
            return False
    return True


def _holds_complete_build(out: Path) -> bool:
    return (out / MODEL_SO).is_file()


def _check_replaceable(out: Path) -> None:
    """Only a folder kiln wrote (or an empty one) is replaced: never a folder of the user's."""
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir():
        raise KilnError(f"{out} is a file, not a build folder", "pick another --out")
    if any(out.iterdir()) and not any((out / name).exists() for name in (STAMPS, "report.json", MODEL_SO)):
        raise KilnError(f"{out} holds files kiln did not write; a build folder is replaced whole",
                        "pick a new or empty folder with --out")


def _swap_in(staged: Path, out: Path) -> Path | None:
    """Put staged at out in one rename; returns where the old folder went (None if none)."""
    if not out.exists() and not out.is_symlink():
        try:
            os.rename(staged, out)
            return None
        except OSError:
            if not out.exists():
                raise
    if _exchange(staged, out):
        return staged
    # Note: a filesystem without RENAME_EXCHANGE: the old folder is renamed away first, so for a
    # moment there is no folder (a loader says so), but never a mixed one.
    old = out.with_name(f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.rename(out, old)
    os.rename(staged, out)
    return old


def _exchange(a: Path, b: Path) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return int(renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)) == 0


def remove_litter(out: Path) -> None:
    """Hidden siblings a killed publish left (`.NAME.publish-PID-HEX`, `.NAME.old-PID-HEX`)."""
    for path in out.parent.glob(f".{out.name}.*-*-*"):
        kind = path.name[len(out.name) + 2:].split("-")
        if len(kind) != 3 or kind[0] not in ("publish", "old") or not kind[1].isdigit():
            continue
        if kind[0] == "old" or not _pid_alive(int(kind[1])):
            shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

