"""What a trace read: the model's own source files and the packages (with versions) it
imported, collected after the export (a depfile).

Note: the packages are those the model's own files import (every import statement in their
source), with everything those packages require, by their installed metadata: never "what this
process loaded during the trace", which depends on what the process had loaded before it. A
worker forked by the stage server (pipeline/server.py) has transformers loaded already, a fresh
one does not, and both must write the same depfile and sources.json.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cache.hashing import digest_file
from contract.config import KILN_PACKAGES, PROJECT_ROOT

# codedeps: kiln's own folders, to leave their files out of the depfile (read by no one)
_KILN_OWN = tuple(PROJECT_ROOT / d for d in KILN_PACKAGES)
_PACKAGE_DIRS = {"site-packages", "dist-packages"}
_STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()


def collect(project_root: Path, factory_module: str) -> dict[str, Any]:
    """Project files among all loaded modules; the packages those files import (any import
    statement in them, by their source) and the factory's own, and every package those require
    (extras included, where installed: a library may act on what is installed), with versions.

    Note: torch comes in when the model imports it; its version is an environment part of the
    key anyway. Kiln's own dependencies (rich, say) come in only when the model's packages
    require them.
    """
    own: dict[str, Path] = {}  # the model's modules: name -> file
    for name, module in list(sys.modules.items()):
        path = _module_path(module)
        if path is not None and _is_model_path(path):
            own[name] = path
    files = {_relative(path, project_root): digest_file(path)[:16] for path in own.values()}
    imported = set().union(*(_imports_of(path) for path in own.values())) | {factory_module.partition(".")[0]}
    imported -= set(sys.stdlib_module_names) | set(sys.builtin_module_names)
    imported -= {name.partition(".")[0] for name in own}  # the model's own modules, by name
    mapping: list[Mapping[str, list[str]]] = []  # every distribution's modules, made at most once
    dists = _required_closure({d for name in sorted(imported) for d in _providers(name, mapping)})
    packages = {d: importlib.metadata.version(d) for d in sorted(dists)}
    return {"files": dict(sorted(files.items())), "packages": packages}


def _imports_of(path: Path) -> set[str]:
    """The top-level names a source file imports absolutely, wherever the statement is."""
    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


def _providers(name: str, mapping: list[Mapping[str, list[str]]]) -> list[str]:
    """The installed distributions that provide the top-level module `name`.

    Note: most are named as their module (torch, transformers), and one distribution's RECORD says
    so in milliseconds; mapping every installed distribution (packages_distributions) takes
    0.4 s, paid only for a name no distribution of its own name provides (yaml: PyYAML).
    """
    try:
        record = "\n" + (importlib.metadata.distribution(name).read_text("RECORD") or "")
        if f"\n{name}/" in record or f"\n{name}.py," in record:
            return [name]
    except importlib.metadata.PackageNotFoundError:
        pass
    if not mapping:
        mapping.append(importlib.metadata.packages_distributions())
    return mapping[0].get(name, [])


def _required_closure(dists: set[str]) -> set[str]:
    """The distributions and, transitively, the installed ones they require.

    Note: extras are left out: followed, transformers' reach 135 distributions and cost a
    second. So an optional package a library uses when installed (accelerate, say) is not in
    the key unless the model's files import it.
    """
    found: dict[str, str] = {}  # normalized name -> the name it is installed under
    todo = sorted(dists)
    while todo:
        name = todo.pop()
        try:
            meta = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        key = _normalized(meta.metadata["Name"])
        if key in found:
            continue
        found[key] = meta.metadata["Name"]
        for requirement in meta.requires or []:
            if not re.search(r"\bextra\s*==", requirement):
                todo.append(re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0])
    return set(found.values())


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _is_model_path(path: Path) -> bool:
    """A file of the model's own: not kiln's, not the standard library's, not a package's."""
    return not (path.is_relative_to(_STDLIB) or _PACKAGE_DIRS.intersection(path.parts)
                or any(path.is_relative_to(own) for own in _KILN_OWN))


def _module_path(module: Any) -> Path | None:
    file = getattr(module, "__file__", None)
    if not isinstance(file, str) or not file.endswith(".py"):
        return None
    path = Path(file).resolve()
    return path if path.is_file() else None


def _relative(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)
