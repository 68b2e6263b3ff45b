"""The house: which of kiln's packages may import which (README, "The house").

Data flows cache -> contract -> tasks -> pipeline -> kiln -> bench -> cli; a package imports
only some of those before it (the benchmarks only the public API; the engine no stage).
Checked two ways: statically, every import statement in every file (a function's own imports
too), and by importing every stage module in one process and looking at what loaded.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from contract.config import PROJECT_ROOT

# Each package, and the kiln packages it may import (itself always).
MAY_IMPORT = {
    "cache": set(),
    "contract": {"cache"},
    "tasks": {"cache", "contract"},
    "pipeline": {"cache", "contract"},
    "kiln": {"cache", "contract", "tasks", "pipeline"},
    "bench": {"kiln"},
    "cli": {"cache", "contract", "pipeline", "kiln", "bench"},
    "models": set(),
}
# Note: `python -m kiln` runs the CLI; no module imports kiln/__main__.py.
ENTRY_POINTS = {"kiln/__main__.py": {"cli"}}


def _kiln_imports(path: Path) -> set[str]:
    """The kiln packages a file imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & {*MAY_IMPORT, "scripts", "tests"}


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_each_package_imports_only_what_sits_below_it(package: str) -> None:
    wrong = []
    for path in sorted((PROJECT_ROOT / package).rglob("*.py")):
        rel = path.relative_to(PROJECT_ROOT).as_posix()
        allowed = {package} | MAY_IMPORT[package] | ENTRY_POINTS.get(rel, set())
        wrong += [f"{rel} imports {name}" for name in sorted(_kiln_imports(path) - allowed)]
    assert not wrong, "\n".join(wrong)


def test_nothing_imports_the_cli() -> None:
    importers = []
    for package in (*MAY_IMPORT, "scripts"):
        for path in sorted((PROJECT_ROOT / package).rglob("*.py")):
            rel = path.relative_to(PROJECT_ROOT).as_posix()
            if package != "cli" and rel not in ENTRY_POINTS and "cli" in _kiln_imports(path):
                importers.append(rel)
    assert not importers, f"these import the CLI: {importers}"


_IMPORT_EVERY_STAGE_MODULE = """
import importlib, json, pkgutil, sys
import tasks
for found in pkgutil.walk_packages(tasks.__path__, "tasks."):
    importlib.import_module(found.name)
print(json.dumps(sorted(sys.modules)))
"""


def test_importing_every_stage_module_loads_no_engine_cli_report_or_api() -> None:
    done = subprocess.run([sys.executable, "-c", _IMPORT_EVERY_STAGE_MODULE], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, check=True)
    loaded = done.stdout.split('"')
    stage_modules = [m for m in loaded if m.startswith("tasks.")]
    assert len(stage_modules) > 50, "the walk found too few stage modules to mean anything"
    above = sorted(m for m in loaded if m.split(".")[0] in ("pipeline", "kiln", "cli", "bench"))
    assert not above, f"importing the stages loaded {above}"
