"""The code a stage runs, found statically: every kiln module its entry imports, transitively,
every file those modules read by a path from `__file__`, and the worker that hosts the stage.

Like Triton, which hashes its whole compiler package into every kernel's key: nothing a stage
runs may change without its key changing. A hand-kept list of source folders drifted (trace,
lower and the codegen stages ran cache/hashing.py without listing it), so the list is computed
from the AST instead (pipeline/codescan.py says what counts as an import and as a read). A
folder read reads every file in it, unless it holds Python code, which is reached (or not) by
imports: the project root and a package's own folder are not data. Only files under the
project root count: torch, triton and the compiler are keyed by their versions
(contract.facts).

Note: each module's scan is kept in the records (ScanStore), keyed by its path, its digest and
the scanner's version, so a no-op compile parses nothing; the closures then cost a few
milliseconds.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cache.hashing import digest_bytes, digest_json
from contract.config import PROJECT_ROOT
from pipeline import codescan
from pipeline.codescan import IMPORTED, Scan, parse_module

CODE_PART = "code:"  # key parts are named code:<file relative to the project root>
# Note: configs/ holds the models' configs, which kiln's config module looks up by a path from
# __file__. They are the user's input, not kiln's code: each stage keys the fields it declares.
MODEL_CONFIGS = "configs"


class ScanStore(Protocol):
    """Where scans persist between processes (cache.records.Records)."""

    def get(self, namespace: str, key: str) -> Any: ...

    def set(self, namespace: str, key: str, value: Any) -> None: ...


class ScanRecords(ScanStore, Protocol):
    """A ScanStore that can be listed and trimmed (cache.records.Records)."""

    def items(self, namespace: str) -> list[tuple[str, Any]]: ...

    def delete(self, namespace: str, key: str) -> None: ...


# Note: kiln's own code always runs on the stage's host too: the worker that imports the entry.
STAGE_HOST = "pipeline.worker"


@dataclass(frozen=True)
class Closure:
    files: tuple[str, ...]  # relative to the root, sorted
    unfollowed: dict[str, tuple[int, ...]]  # file -> lines where a path is made in a way not followed


def code_parts(entry: str, root: Path = PROJECT_ROOT, store: ScanStore | None = None) -> dict[str, str]:
    """`code:<file>` -> digest for every file the stage whose entry is "module:function" runs."""
    files = sorted({*closure_of(entry.partition(":")[0], root, store).files,
                    *closure_of(STAGE_HOST, root, store).files})
    return {f"{CODE_PART}{rel}": file_digest(root / rel)[:16] for rel in files}


def stage_code_digest(entry: str, root: Path = PROJECT_ROOT, scans: ScanStore | None = None) -> str:
    """One digest of all the code a stage runs (its code parts): the key part of any cache item
    the stage makes inside itself (a kernel's tuning, kiln's runtime objects), which the stage's
    own key does not reach. The runner computes it and hands it to the stage in its job."""
    return digest_json(sorted(code_parts(entry, root, scans).items()))


def code_closure(module: str, root: Path = PROJECT_ROOT, store: ScanStore | None = None) -> tuple[str, ...]:
    """Files (relative, sorted) of `module`, the kiln modules it reaches and the files they read."""
    return closure_of(module, root, store).files


def closure_of(module: str, root: Path = PROJECT_ROOT, store: ScanStore | None = None) -> Closure:
    """The closure of `module`, once per process (kiln's files do not change under a compile)."""
    known = _CLOSURES.get((module, root))
    if known is None:
        known = _CLOSURES[(module, root)] = _walk(module, root, store)
    return known


def _walk(module: str, root: Path, store: ScanStore | None) -> Closure:
    seen: set[Path] = set()
    unfollowed: dict[str, tuple[int, ...]] = {}
    pending = list(_module_chain(module, root))
    if not pending:
        raise ValueError(f"{module!r} is not a module of kiln's (under {root})")
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        if path.suffix != ".py":
            continue
        scan = _full_scan(path, root, store)
        for name in scan.imports:
            pending.extend(_module_chain(name, root))
        for rel in scan.reads:
            pending.extend(_data_files(rel, root, store))
        if scan.unfollowed:
            unfollowed[path.relative_to(root).as_posix()] = scan.unfollowed
    return Closure(tuple(sorted(p.relative_to(root).as_posix() for p in seen)), unfollowed)


def _full_scan(path: Path, root: Path, store: ScanStore | None) -> Scan:
    """The module's scan, rescanned with the names it imports that are paths in their module."""
    scan = scan_module(path, root, store)
    path_imports = {}
    for local, (module, name) in scan.from_names.items():
        exporter = _module_file(module, root)
        if exporter is not None and name in scan_module(exporter, root, store).path_names:
            path_imports[local] = f"{module}/{name}"
    return scan_module(path, root, store, path_imports) if path_imports else scan


@functools.cache
def _module_file(module: str, root: Path) -> Path | None:
    """The file of kiln module `module` itself (a package's __init__.py), if there is one."""
    base = root.joinpath(*module.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def file_digest(path: Path) -> str:
    """A file's sha256, read once per process (a compile's keys all see one version of kiln)."""
    return digest_bytes(path.read_bytes())


def scan_module(path: Path, root: Path, store: ScanStore | None = None,
                path_imports: Mapping[str, str] | None = None) -> Scan:
    """One module's scan: from this process's memo, from `store`, or parsed (and then stored).

    Note: a scan depends on the file's bytes, its place under the root (relative imports, paths
    from __file__), the imported names that are paths, and the scanner's own code: all four
    make its key.
    """
    imported = tuple(sorted((path_imports or {}).items()))
    memo_key = (path, file_digest(path), imported)
    memo = _MEMO.get(memo_key)
    if memo is not None:
        return memo
    key = digest_json([path.relative_to(root).as_posix(), memo_key[1], imported, _scanner_version()])
    known = store.get(_NAMESPACE, key) if store is not None else None
    try:
        scan = Scan.from_json(known) if isinstance(known, dict) else None
    except (KeyError, TypeError, IndexError):
        scan = None
    if scan is None:
        scan = parse_module(path, root, path_imports)
        if store is not None:
            store.set(_NAMESPACE, key, scan.to_json())
    _MEMO[memo_key] = scan
    return scan


@functools.cache
def _scanner_version() -> str:
    return file_digest(Path(codescan.__file__).resolve())[:16]


def forget_scans(store: ScanRecords) -> int:
    """Drop every scan kept in the records (gc: an old file's scans are never read again, and
    the next compile rescans what it needs, in a fraction of a second); returns how many."""
    found = [key for key, _ in store.items(_NAMESPACE)]
    for key in found:
        store.delete(_NAMESPACE, key)
    return len(found)


def forget_files() -> None:
    """Forget this process's file digests and closures, keeping the scans (kept by digest): for
    a test that edits files between key checks."""
    file_digest.cache_clear()
    _CLOSURES.clear()


def clear_memo() -> None:
    """Forget everything this process knows of kiln's files, scans included."""
    forget_files()
    _MEMO.clear()
    _scanner_version.cache_clear()
    _module_chain.cache_clear()
    _module_file.cache_clear()


_NAMESPACE = "codescan"
_MEMO: dict[tuple[Path, str, tuple[tuple[str, str], ...]], Scan] = {}
_CLOSURES: dict[tuple[str, Path], Closure] = {}


@functools.cache
def _module_chain(name: str, root: Path) -> tuple[Path, ...]:
    """The files that importing `name` runs, where they are kiln's: each package's __init__.py
    on the way down, then the module itself; for "a.*", every module of package a."""
    if name.endswith(".*"):
        package = root.joinpath(*name[:-2].split("."))
        return tuple(sorted(package.glob("*.py"))) if (package / "__init__.py").is_file() else ()
    files: list[Path] = []
    parts = name.split(".")
    for depth in range(1, len(parts) + 1):
        base = root.joinpath(*parts[:depth])
        for candidate in (base / "__init__.py", base.with_suffix(".py")):
            if candidate.is_file():
                files.append(candidate)
                break
    return tuple(files)


def _data_files(rel: str, root: Path, store: ScanStore | None) -> list[Path]:
    """The files a path read by a module stands for (see the module's docstring)."""
    if rel.startswith(f"{IMPORTED}/"):
        return _imported_data_files(rel, root, store)
    try:
        path = (root / rel).resolve()
    except OSError:
        return []
    if not path.is_relative_to(root.resolve()) or path.is_relative_to(root.resolve() / MODEL_CONFIGS):
        return []
    if path.is_file():
        return [path]
    if not path.is_dir() or next(path.rglob("*.py"), None) is not None:
        return []
    return sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def _imported_data_files(rel: str, root: Path, store: ScanStore | None) -> list[Path]:
    """IMPORTED/<module>/<name>/<parts...>: the paths <name> is bound to in <module>, then parts."""
    _, module, name, *parts = rel.split("/")
    exporter = _module_file(module, root)
    if exporter is None:
        return []
    bound = scan_module(exporter, root, store).path_names.get(name, ())
    return [f for base in bound for f in _data_files("/".join([base, *parts]), root, store)]
