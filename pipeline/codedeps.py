"""The code a stage runs, found statically: every kiln module its entry imports, transitively,
and every file those modules read by a path built from `__file__`.

Like Triton, which hashes its whole compiler package into every kernel's key: nothing a stage
runs may change without its key changing. A hand-kept list of source folders drifted (trace,
lower and the codegen stages ran cache/hashing.py without listing it), so the list is computed
from the AST instead:
- `import a.b.c` reaches a, a.b and a.b.c (each package's __init__ runs); `from a.b import c`
  reaches a.b, and a.b.c when c is a module; relative imports resolve against the package;
  `importlib.import_module("a.b")` with a constant name counts as an import. Imports inside
  functions count too; those under `if TYPE_CHECKING:` never run and do not.
- A module that names a file by a path from `__file__` (`Path(__file__).parents[1] / "tune" /
  "cpu_tune.py"`, or a name bound to one) reads it: a template it copies, a header it compiles.
  A folder named so reads every file in it, unless it holds Python code, which is reached (or
  not) by imports: the project root and a package's own folder are not data. A path made from
  one some other way (os.path.join, .glob, an f-string) is not followed but flagged
  (Scan.unfollowed), and a test keeps stage code free of those.
Only modules under the project root count: torch, triton and the compiler are keyed by their
versions (pipeline.envfacts).

Note: a module's scan is cached by its content digest within a process, and the whole scan of
kiln (about 150 files) takes tens of milliseconds, a small part of a no-op compile.
"""

from __future__ import annotations

import ast
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cache.hashing import digest_bytes, digest_json
from pipeline.config import PROJECT_ROOT

CODE_PART = "code:"  # key parts are named code:<file relative to the project root>
# Note: configs/ holds the models' configs, which kiln's config module looks up by a path from
# __file__. They are the user's input, not kiln's code: each stage keys the fields it declares.
MODEL_CONFIGS = "configs"


class ScanStore(Protocol):
    """Where scans persist between processes (cache.records.Records), by file digest."""

    def get(self, namespace: str, key: str) -> Any: ...

    def set(self, namespace: str, key: str, value: Any) -> None: ...


@dataclass(frozen=True)
class Scan:
    """What one module's source says it needs: modules it imports, paths it reads (relative to
    the project root)."""

    imports: tuple[str, ...]
    reads: tuple[str, ...]
    unfollowed: tuple[int, ...] = ()  # lines where a path from __file__ is made into one not followed


def code_parts(entry: str, root: Path = PROJECT_ROOT, store: ScanStore | None = None) -> dict[str, str]:
    """`code:<file>` -> digest for every file the stage whose entry is "module:function" runs."""
    files = code_closure(entry.partition(":")[0], root, store)
    return {f"{CODE_PART}{rel}": file_digest(root / rel)[:16] for rel in files}


def code_digest(module: str, root: Path = PROJECT_ROOT) -> str:
    """One digest of all the code `module` runs: for the key of a cache item a stage computes
    inside itself (a kernel's tuning, kiln's runtime objects), which the stage's key does not
    reach."""
    return digest_json(sorted(code_parts(module, root).items()))


def code_closure(module: str, root: Path = PROJECT_ROOT, store: ScanStore | None = None) -> tuple[str, ...]:
    """Files (relative, sorted) of `module`, the kiln modules it reaches and the files they read."""
    seen: set[Path] = set()
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
        scan = scan_module(path, root, store)
        for name in scan.imports:
            pending.extend(_module_chain(name, root))
        for rel in scan.reads:
            pending.extend(_data_files(root / rel, root))
    return tuple(sorted(p.relative_to(root).as_posix() for p in seen))


@functools.cache
def file_digest(path: Path) -> str:
    """A file's sha256, read once per process (a compile's keys all see one version of kiln)."""
    return digest_bytes(path.read_bytes())


def scan_module(path: Path, root: Path, store: ScanStore | None = None) -> Scan:
    """The imports and reads of one module: from this process's memo, from `store` by the file's
    digest, or parsed (and then stored)."""
    digest = file_digest(path)
    memo = _MEMO.get(digest)
    if memo is not None:
        return memo
    known = store.get(_NAMESPACE, digest) if store is not None else None
    if isinstance(known, dict) and set(known) == {"imports", "reads", "unfollowed"}:
        scan = Scan(tuple(known["imports"]), tuple(known["reads"]), tuple(known["unfollowed"]))
    else:
        scan = parse_module(path, root)
        if store is not None:
            store.set(_NAMESPACE, digest, {"imports": list(scan.imports), "reads": list(scan.reads),
                                           "unfollowed": list(scan.unfollowed)})
    _MEMO[digest] = scan
    return scan


def clear_memo() -> None:
    """Forget this process's digests and scans (a test that edits files between key checks)."""
    _MEMO.clear()
    file_digest.cache_clear()


# Note: the scan of a file depends only on its bytes and its place under the root (relative
# imports, paths from __file__); the digest names the bytes, the version names the scanner.
_NAMESPACE = "codescan-1"
_MEMO: dict[str, Scan] = {}


def parse_module(path: Path, root: Path) -> Scan:
    source = path.read_bytes()
    tree = ast.parse(source, filename=str(path))
    package = _package_of(path, root)
    imports: list[str] = []
    for node in _running_nodes(tree, source):
        imports.extend(_imports_of(node, package))
    reads: list[str] = []
    unfollowed: list[int] = []
    if b"__file__" in source:
        found, unfollowed = PathResolver(path, tree).reads()
        for read in found:
            resolved = Path(os.path.normpath(read))
            if resolved.is_relative_to(root):
                reads.append(resolved.relative_to(root).as_posix())
    return Scan(tuple(dict.fromkeys(imports)), tuple(dict.fromkeys(reads)), tuple(unfollowed))


def _package_of(path: Path, root: Path) -> list[str]:
    """The package a module's relative imports start from (a package's __init__: itself)."""
    return list(path.relative_to(root).parts[:-1])


def _running_nodes(tree: ast.Module, source: bytes) -> Iterator[ast.AST]:
    """The statements of the module, nested ones too, except the bodies of `if TYPE_CHECKING:`
    (never run); and every expression too where the source calls import_module or __import__.

    Note: walking statements only is ten times faster than ast.walk (imports are statements).
    """
    stack: list[ast.AST] = list(tree.body)
    deep = b"import_module" in source or b"__import__" in source
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if deep:
            stack.extend(ast.iter_child_nodes(node))
            continue
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            stack.extend(s for s in getattr(node, field, ()) if isinstance(s, ast.AST))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports_of(node: ast.AST, package: list[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            up = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            base = ".".join([*up, *([node.module] if node.module else [])])
        else:
            base = node.module or ""
        # `from a import b`: b may be a module of a or a name in it; _module_chain keeps what exists
        return [base, *(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")]
    if isinstance(node, ast.Call) and _is_import_call(node.func) and node.args:
        first = node.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return [first.value]
    return []


def _is_import_call(func: ast.expr) -> bool:
    if isinstance(func, ast.Attribute):
        return func.attr == "import_module"
    return isinstance(func, ast.Name) and func.id in ("import_module", "__import__")


@functools.cache
def _module_chain(name: str, root: Path) -> tuple[Path, ...]:
    """The files that importing `name` runs, where they are kiln's: each package's __init__.py
    on the way down, then the module itself."""
    files: list[Path] = []
    parts = name.split(".")
    for depth in range(1, len(parts) + 1):
        base = root.joinpath(*parts[:depth])
        for candidate in (base / "__init__.py", base.with_suffix(".py")):
            if candidate.is_file():
                files.append(candidate)
                break
    return tuple(files)


def _data_files(path: Path, root: Path) -> list[Path]:
    """The files a path read by a module stands for (see the module's docstring)."""
    try:
        path = path.resolve()
    except OSError:
        return []
    if not path.is_relative_to(root.resolve()) or path.is_relative_to(root.resolve() / MODEL_CONFIGS):
        return []
    if path.is_file():
        return [path]
    if not path.is_dir() or next(path.rglob("*.py"), None) is not None:
        return []
    return sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


class PathResolver:
    """Evaluates the path expressions of a module that start from `__file__`.

    Understood: `__file__`, `Path(x)`, `x.parent`, `x.parents[N]`, `x.resolve()`, `x.absolute()`,
    `x / "const"`, and a name assigned one of these anywhere in the module. Only outermost
    expressions count as reads: the folder inside `Path(__file__).parent / "kiln_cpu.h"` is a
    step, not a read.
    """

    def __init__(self, path: Path, tree: ast.Module) -> None:
        self.path = path
        self.tree = tree
        self.names: dict[str, Path] = {}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign) or len(node.targets) != 1:
                continue
            target, value = node.targets[0], self.value(node.value)
            if isinstance(target, ast.Name) and value is not None:
                self.names[target.id] = value

    def reads(self) -> tuple[list[Path], list[int]]:
        """The paths read, and the lines where a path from __file__ is made into another path
        in a way this class does not follow (such a read would be missed: a test keeps kiln free
        of them)."""
        found: list[Path] = []
        unfollowed: list[int] = []
        self._outermost(self.tree, found, unfollowed)
        return found, unfollowed

    def _outermost(self, node: ast.AST, found: list[Path], unfollowed: list[int]) -> None:
        for child in ast.iter_child_nodes(node):
            value = self.value(child) if isinstance(child, ast.expr) else None
            if value is None:
                self._outermost(child, found, unfollowed)
                continue
            if not _is_bare_name(child, self.names):
                found.append(value)
            if _derives_a_path(node, child):
                unfollowed.append(getattr(child, "lineno", 0))

    def value(self, node: ast.expr) -> Path | None:
        if isinstance(node, ast.Name):
            return self.path if node.id == "__file__" else self.names.get(node.id)
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.Attribute) and node.attr == "parent":
            inner = self.value(node.value)
            return inner.parent if inner is not None else None
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "parents" and isinstance(node.slice, ast.Constant):
            inner = self.value(node.value.value)
            index = node.slice.value
            return inner.parents[index] if inner is not None and isinstance(index, int) else None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) \
                and isinstance(node.right, ast.Constant) and isinstance(node.right.value, str):
            inner = self.value(node.left)
            return inner / node.right.value if inner is not None else None
        return None

    def _call(self, node: ast.Call) -> Path | None:
        func = node.func
        if isinstance(func, ast.Name) and func.id == "Path" and len(node.args) == 1:
            return self.value(node.args[0])
        if isinstance(func, ast.Attribute) and func.attr in ("resolve", "absolute") and not node.args:
            return self.value(func.value)
        return None


_KEEPS_THE_PATH = {"read_text", "read_bytes", "open", "is_file", "is_dir", "exists", "stat", "as_posix",
                   "name", "stem", "suffix"}
_DERIVES = {"join", "dirname", "abspath", "realpath", "normpath", "relpath"}  # os.path's


def _derives_a_path(parent: ast.AST, child: ast.AST) -> bool:
    """Whether `parent` makes a path from __file__ (child) into another path: by an operator, a
    format string, a method such as .glob or .with_suffix, a non-constant index or os.path."""
    if isinstance(parent, (ast.BinOp, ast.JoinedStr, ast.FormattedValue, ast.Subscript)):
        return True
    if isinstance(parent, ast.Attribute):
        return parent.attr not in _KEEPS_THE_PATH
    if isinstance(parent, ast.Call) and child is not parent.func:
        func = parent.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        return name in _DERIVES
    return False


def _is_bare_name(node: ast.AST, names: dict[str, Path]) -> bool:
    """A use of a name bound to a path: its assignment already counted the read."""
    return isinstance(node, ast.Name) and node.id in names
