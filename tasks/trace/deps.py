"""What a trace read: the model's own source files and the packages (with versions) it
imported, collected from sys.modules after the export (a depfile)."""

from __future__ import annotations

import importlib.metadata
import sys
import sysconfig
from pathlib import Path
from typing import Any

from cache.hashing import digest_file
from contract.config import KILN_PACKAGES, PROJECT_ROOT

# codedeps: kiln's own folders, to leave their files out of the depfile (read by no one)
_KILN_OWN = tuple(PROJECT_ROOT / d for d in KILN_PACKAGES)
_PACKAGE_DIRS = {"site-packages", "dist-packages"}


def collect(project_root: Path, imported_before: set[str]) -> dict[str, Any]:
    """Project files among all loaded modules; packages among those the trace imported.

    Note: packages already loaded before the trace (kiln's own dependencies, torch) are left
    out so that upgrading, say, rich does not retrace every model; torch's version is an
    environment part of the key anyway.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    top_to_dists = importlib.metadata.packages_distributions()
    files: dict[str, str] = {}
    dists: set[str] = set()
    for name, module in list(sys.modules.items()):
        path = _module_path(module)
        if path is None or path.is_relative_to(stdlib):
            continue
        if _PACKAGE_DIRS.intersection(path.parts):
            if name not in imported_before:
                    dists.update(top_to_dists.get(name.split(".")[0], []))
        elif not any(path.is_relative_to(own) for own in _KILN_OWN):
            files[_relative(path, project_root)] = digest_file(path)[:16]
    packages = {d: importlib.metadata.version(d) for d in sorted(dists)}
    return {"files": dict(sorted(files.items())), "packages": packages}


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
