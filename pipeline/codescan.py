"""One kiln module's source, read for what it needs: the modules it imports and the files it reads
by a path from `__file__` (pipeline/codedeps.py follows these from a stage's entry).

What counts as an import: `import a.b.c`, `from a.b import c` (c may be a module), relative
imports, `from a import *` (every module of package a), `importlib.import_module("a.b")` with a
constant name, imports inside functions, Python source in a string (a `python -c` script, in a
module that starts Python or runs source: sys.executable, exec, runpy) and `"-m", "a.b"` in a
list (a `python -m` command). Imports under `if TYPE_CHECKING:` never run and
do not count.

What counts as a read: a path built from `__file__` by `Path(x)`, `.parent`, `.parents[N]`,
`.resolve()`, `.absolute()` and `/ "constant"` (or a name bound to a constant), directly or
through a name bound to one in this module (`HERE = Path(__file__).parent`, annotated or not,
in any function), or through such a name imported from another kiln module (resolved by
codedeps, which scans that module too).

A path from `__file__` made into another one in any other way (os.path.join, .glob, an
f-string, `/` with a variable, `import_module` with a variable) is not followed: its line is
listed in `unfollowed`, and a test keeps every stage's code free of them. A line that says why
it is safe with a `# codedeps:` comment (at its end, or alone on the line before) is not.
"""

from __future__ import annotations

import ast
import itertools
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

IMPORTED = "<imported>"  # a read through an imported name: <imported>/<module>/<name>/<parts...>
PRAGMA = "# codedeps:"


@dataclass(frozen=True)
class Scan:
    """What one module's source says it needs. Paths are relative to the project root."""

    imports: tuple[str, ...]  # module names; "a.*" for every module of package a
    reads: tuple[str, ...]  # files or folders; or IMPORTED/<module>/<name>/<parts...>
    path_names: dict[str, tuple[str, ...]] = field(default_factory=dict)  # name -> the paths bound to it
    from_names: dict[str, tuple[str, str]] = field(default_factory=dict)  # local name -> (module, name)
    unfollowed: tuple[int, ...] = ()  # lines where a path is made in a way not followed

    def to_json(self) -> dict[str, object]:
        return {"imports": list(self.imports), "reads": list(self.reads),
                "path_names": {k: list(v) for k, v in sorted(self.path_names.items())},
                "from_names": {k: list(v) for k, v in sorted(self.from_names.items())},
                "unfollowed": list(self.unfollowed)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Scan:
        return cls(tuple(data["imports"]), tuple(data["reads"]),
                   {k: tuple(v) for k, v in data["path_names"].items()},
                   {k: (v[0], v[1]) for k, v in data["from_names"].items()}, tuple(data["unfollowed"]))


def parse_module(path: Path, root: Path, path_imports: Mapping[str, str] | None = None) -> Scan:
    """The module's scan. `path_imports` maps local names it imported from other kiln modules,
    where they are bound to paths, to "<module>/<name>": uses of those are reads too."""
    source = path.read_bytes()
    tree = ast.parse(source, filename=str(path))
    package = list(path.relative_to(root).parts[:-1])  # where relative imports start
    imports: list[str] = []
    unfollowed: list[int] = []
    from_names: dict[str, tuple[str, str]] = {}
    for node in _running_nodes(tree, source):
        found, dynamic = _imports_of(node, package)
        imports.extend(found)
        unfollowed.extend(dynamic)
        if isinstance(node, ast.ImportFrom):
            base = _from_base(node, package)
            from_names.update({a.asname or a.name: (base, a.name) for a in node.names if a.name != "*"})
    reads: list[Path] = []
    path_names: dict[str, tuple[str, ...]] = {}
    if b"__file__" in source or path_imports:
        resolver = PathResolver(path, tree, path_imports or {})
        reads, unfollowed_paths = resolver.reads()
        unfollowed.extend(unfollowed_paths)
        path_names = {name: tuple(_relative(p, root) for p in paths) for name, paths in resolver.names.items()
                      if not any(_is_imported(p) for p in paths)}
    allowed = _pragma_lines(source)
    return Scan(tuple(dict.fromkeys(imports)), tuple(dict.fromkeys(_relative(p, root) for p in reads)),
                path_names, from_names, tuple(sorted(set(unfollowed) - allowed)))


def _pragma_lines(source: bytes) -> set[int]:
    """Lines a `# codedeps:` comment vouches for: its own, and the next if it stands alone."""
    lines = source.decode(errors="replace").splitlines()
    found = set()
    for number, line in enumerate(lines, start=1):
        if PRAGMA in line:
            found.add(number)
            if line.lstrip().startswith(PRAGMA):
                found.add(number + 1)
    return found


def _relative(path: Path, root: Path) -> str:
    if _is_imported(path):
        return path.relative_to("/").as_posix()
    return Path(os.path.relpath(os.path.normpath(path), root)).as_posix()


def _is_imported(path: Path) -> bool:
    return path.parts[:2] == ("/", IMPORTED)


def _running_nodes(tree: ast.Module, source: bytes) -> Iterator[ast.AST]:
    """The statements of the module, nested ones too, except the bodies of `if TYPE_CHECKING:`
    (never run); and every expression too where the source may import in one (import_module,
    __import__, a script in a string, "-m").

    Note: walking statements only is ten times faster than ast.walk (imports are statements).
    """
    stack: list[ast.AST] = list(tree.body)
    deep = any(word in source for word in _DEEP)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if deep:
            stack.extend(ast.iter_child_nodes(node))
            continue
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            stack.extend(s for s in getattr(node, name, ()) if isinstance(s, ast.AST))


# Note: what makes an expression import: an import call, a -m command, or a script in a string,
# which only runs where the module starts Python (sys.executable) or runs source (exec, runpy).
_DEEP = (b"import_module", b"__import__", b'"-m"', b"'-m'", b"sys.executable", b"exec(", b"runpy")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports_of(node: ast.AST, package: list[str]) -> tuple[list[str], list[int]]:
    """The modules a node imports, and its line if it imports a module it does not name."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names], []
    if isinstance(node, ast.ImportFrom):
        base = _from_base(node, package)
        names = [f"{base}.*" if alias.name == "*" else f"{base}.{alias.name}" for alias in node.names]
        return [base, *names], []  # `from a import b`: b may be a module of a, or a name in it
    if isinstance(node, ast.Call) and _is_import_call(node.func):
        first = node.args[0] if node.args else None
        name = first.value if isinstance(first, ast.Constant) else None
        if isinstance(name, str) and not name.startswith("."):
            return [name], []
        return [], [node.lineno]
    if isinstance(node, (ast.List, ast.Tuple)):
        return _dash_m(node.elts), []
    if isinstance(node, (ast.Constant, ast.JoinedStr)):
        return _script_imports(node, package), []
    return [], []


def _from_base(node: ast.ImportFrom, package: list[str]) -> str:
    if not node.level:
        return node.module or ""
    up = package[: len(package) - (node.level - 1)] if node.level > 1 else package
    return ".".join([*up, *([node.module] if node.module else [])])


def _is_import_call(func: ast.expr) -> bool:
    if isinstance(func, ast.Attribute):
        return func.attr == "import_module"
    return isinstance(func, ast.Name) and func.id in ("import_module", "__import__")


def _dash_m(elts: list[ast.expr]) -> list[str]:
    """`[python, "-m", "a.b", ...]`: a command that runs module a.b."""
    found = []
    for flag, name in itertools.pairwise(elts):
        if isinstance(flag, ast.Constant) and flag.value == "-m" and isinstance(name, ast.Constant) \
                and isinstance(name.value, str):
            found.append(name.value)
    return found


def _script_imports(node: ast.Constant | ast.JoinedStr, package: list[str]) -> list[str]:
    """The imports of Python source held in a string (an f-string's fields read as `0`)."""
    if isinstance(node, ast.Constant):
        text = node.value if isinstance(node.value, str) else ""
    else:
        text = "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "0"
                       for v in node.values)
    if "import " not in text:
        return []
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    found: list[str] = []
    for inner in ast.walk(tree):
        if isinstance(inner, (ast.Import, ast.ImportFrom)):
            found.extend(_imports_of(inner, package)[0])
    return found


class PathResolver:
    """Evaluates a module's path expressions that start from `__file__` or an imported name.

    Only outermost expressions count as reads: the folder inside `Path(__file__).parent /
    "kiln_cpu.h"` is a step, not a read. A name bound to a path counts where it is bound.
    """

    def __init__(self, path: Path, tree: ast.Module, path_imports: Mapping[str, str]) -> None:
        self.path = path
        self.tree = tree
        self.names: dict[str, list[Path]] = {name: [Path("/", IMPORTED, *anchor.split("/"))]
                                             for name, anchor in path_imports.items()}
        self.strings: dict[str, str] = {}  # names bound to one string constant (a file's name)
        bindings = [b for b in map(_binding, ast.walk(tree)) if b is not None]
        for name, value in bindings:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                self.strings[name] = value.value
        for name, value in bindings:
            for found in self.values(value):
                self.names.setdefault(name, []).append(found)

    def reads(self) -> tuple[list[Path], list[int]]:
        """The paths read, and the lines where a path is made into another one not followed."""
        found: list[Path] = []
        unfollowed: list[int] = []
        self._outermost(self.tree, found, unfollowed)
        return found, unfollowed

    def _outermost(self, node: ast.AST, found: list[Path], unfollowed: list[int]) -> None:
        for child in ast.iter_child_nodes(node):
            values = self.values(child) if isinstance(child, ast.expr) else []
            if not values:
                self._outermost(child, found, unfollowed)
                continue
            if not (isinstance(child, ast.Name) and child.id in self.names):  # bare: counted where bound
                found.extend(values)
            if _derives_a_path(node, child):
                unfollowed.append(getattr(child, "lineno", 0))

    def values(self, node: ast.expr) -> list[Path]:
        """Every path the expression may be (a name bound in several places: each)."""
        if isinstance(node, ast.Name):
            return [self.path] if node.id == "__file__" else list(self.names.get(node.id, ()))
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == "Path" and len(node.args) == 1:
                return self.values(node.args[0])
            if isinstance(func, ast.Attribute) and func.attr in ("resolve", "absolute") and not node.args:
                return self.values(func.value)
            return []
        # Note: an imported path is followed down (`/ "x"`) only; going up from it is not followed.
        if isinstance(node, ast.Attribute) and node.attr == "parent":
            return [p.parent for p in self.values(node.value) if not _is_imported(p)]
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "parents" and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, int):
            index = node.slice.value
            return [p.parents[index] for p in self.values(node.value.value)
                    if index < len(p.parents) and not _is_imported(p)]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            part = self._string(node.right)
            return [p / part for p in self.values(node.left)] if part is not None else []
        return []

    def _string(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        return self.strings.get(node.id) if isinstance(node, ast.Name) else None


def _binding(node: ast.AST) -> tuple[str, ast.expr] | None:
    """`name = value` or `name: T = value`: the name and the value."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id, node.value
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        return node.target.id, node.value
    return None


_KEEPS_THE_PATH = {"read_text", "read_bytes", "open", "is_file", "is_dir", "exists", "stat", "as_posix",
                   "name", "stem", "suffix"}
_DERIVES = {"join", "dirname", "abspath", "realpath", "normpath", "relpath"}  # os.path's


def _derives_a_path(parent: ast.AST, child: ast.AST) -> bool:
    """Whether `parent` makes a path (child) into another path: by an operator, a format string,
    a method such as .glob or .with_suffix, a non-constant index or os.path."""
    if isinstance(parent, (ast.BinOp, ast.JoinedStr, ast.FormattedValue, ast.Subscript)):
        return True
    if isinstance(parent, ast.Attribute):
        return parent.attr not in _KEEPS_THE_PATH
    if isinstance(parent, ast.Call) and child is not parent.func:
        func = parent.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        return name in _DERIVES
    return False
