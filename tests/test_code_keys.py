"""Every stage's key covers all the code it runs (pipeline/codedeps.py): a comment appended to any
kiln file changes the key of each stage that runs it and of no other, checked on a copy of the
tree through the key path alone (no compiles)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from contract.config import PROJECT_ROOT
from pipeline import codedeps, codescan
from pipeline.codescan import Scan
from pipeline.stages import STAGES
from tasks.targets import TARGETS

KILN_DIRS = ("cache", "contract", "tasks", "pipeline", "kiln", "cli", "runtime", "bench", "scripts")
RUNTIME_READERS = {"runtime/kiln_cpu.h": {"gen-tuning-code", "link"}}  # besides link, for every file


def _copy_tree(dest: Path) -> Path:
    for name in KILN_DIRS:
        shutil.copytree(PROJECT_ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(PROJECT_ROOT / "configs", dest / "configs")
    return dest.resolve()


def _entries(target: str = "cpu") -> dict[str, str]:
    return {s.name: entry for s in STAGES if (entry := s.entry_for(target))}


def _stage_parts(root: Path, target: str = "cpu") -> dict[str, dict[str, str]]:
    codedeps.forget_files()
    return {name: codedeps.code_parts(entry, root) for name, entry in _entries(target).items()}


def _imported_files(root: Path) -> dict[str, set[str]]:
    """Ground truth from Python itself: the kiln files in sys.modules after importing each
    stage's entry module in a fresh process (a lower bound: lazy imports are not run)."""
    script = """
import importlib, json, sys
from pathlib import Path
root = Path(sys.argv[1])
found = {}
for stage, module in json.loads(sys.argv[2]).items():
    importlib.import_module(module)
    files = {getattr(m, "__file__", None) for m in list(sys.modules.values())}
    found[stage] = sorted(Path(f).resolve().relative_to(root).as_posix() for f in files
                          if f and Path(f).resolve().is_relative_to(root))
print(json.dumps(found))
"""
    result = {}
    for name, entry in _entries().items():
        entries = json.dumps({name: entry.partition(":")[0]})
        proc = subprocess.run([sys.executable, "-c", script, str(root), entries], cwd=root,
                              capture_output=True, text=True, check=True)
        result.update({k: set(v) for k, v in json.loads(proc.stdout).items()})
    return result


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _copy_tree(tmp_path_factory.mktemp("tree"))


def test_a_comment_in_any_file_changes_exactly_the_stages_that_run_it(tree: Path) -> None:
    imported = _imported_files(tree)
    baseline = _stage_parts(tree)
    files = sorted(p for d in KILN_DIRS for p in (tree / d).rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts)
    assert len(files) > 100
    reached_by_some = 0
    for path in files:
        rel = path.relative_to(tree).as_posix()
        original = path.read_bytes()
        comment = b"\n// kiln key test\n" if path.suffix in (".h", ".cpp") else b"\n# kiln key test\n"
        path.write_bytes(original + comment)
        try:
            after = _stage_parts(tree)
        finally:
            path.write_bytes(original)
        changed = {stage for stage in baseline if after[stage] != baseline[stage]}
        must = {stage for stage, files in imported.items() if rel in files}
        if rel.startswith("runtime/"):
            must |= RUNTIME_READERS.get(rel, set()) | {"link"}
        assert must <= changed, f"{rel}: stages {sorted(must - changed)} run it, but their keys stay"
        reaching = {stage for stage in baseline if f"code:{rel}" in baseline[stage]}
        assert changed == reaching, f"{rel}: changed {sorted(changed)}, reached by {sorted(reaching)}"
        for stage in changed:
            assert after[stage][f"code:{rel}"] != baseline[stage][f"code:{rel}"]
        reached_by_some += bool(changed)
    assert reached_by_some > 60


def test_what_no_stage_runs_changes_no_key(tree: Path) -> None:
    baseline = _stage_parts(tree)
    for rel in ("cli/main.py", "cli/commands.py", "bench/suite.py", "configs/mlp.toml"):
        path = tree / rel
        original = path.read_bytes()
        path.write_bytes(original + b"\n# kiln key test\n")
        try:
            assert _stage_parts(tree) == baseline, rel
        finally:
            path.write_bytes(original)


def test_runtime_headers_reach_only_the_stages_that_compile_or_copy_them(tree: Path) -> None:
    parts = _stage_parts(tree)
    for stage in ("trace", "lower", "schedule", "autotune", "gen-cpp"):
        assert not [p for p in parts[stage] if p.startswith("code:runtime/")], stage
    runtime = {f"code:runtime/{p.name}" for p in (tree / "runtime").iterdir() if p.is_file()}
    assert runtime <= set(parts["link"])
    assert "code:tasks/targets/cpu/tune.py" in parts["gen-tuning-code"]  # copied as tune.py, never imported


def test_scans_are_kept_by_digest_between_processes(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Store(dict[tuple[str, str], object]):
        def get(self, namespace: str, key: str) -> object:  # type: ignore[override]
            return super().get((namespace, key))

        def set(self, namespace: str, key: str, value: object) -> None:
            self[(namespace, key)] = value

    store = Store()
    codedeps.clear_memo()
    first = codedeps.code_closure("tasks.link.stage", tree, store)
    assert store
    codedeps.clear_memo()
    parsed: list[Path] = []
    real = codescan.parse_module

    def counting(path: Path, root: Path, path_imports: Mapping[str, str] | None = None) -> Scan:
        parsed.append(path)
        return real(path, root, path_imports)

    monkeypatch.setattr(codedeps, "parse_module", counting)
    assert codedeps.code_closure("tasks.link.stage", tree, store) == first
    assert parsed == []


def test_explain_names_the_kiln_file_that_changed(tmp_path: Path) -> None:
    """The issue's own case: a comment appended to cache/hashing.py reruns trace, and explain
    says so by name (a hand-kept list had left it out)."""
    root = _copy_tree(tmp_path / "kiln")
    shutil.copytree(PROJECT_ROOT / "models", root / "models")
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(root), COLUMNS="200")

    def kiln(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "kiln", *args], cwd=root, env=env,
                              capture_output=True, text=True, check=False, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    kiln("compile", "mlp", "--target", "cpu", "--until", "trace")
    with (root / "cache" / "hashing.py").open("a") as f:
        f.write("# a comment\n")
    out = kiln("explain", "mlp", "--target", "cpu")
    trace = out.split("lower")[0]
    assert "rerun: yes" in trace
    assert "part code:cache/hashing.py changed" in trace


def test_every_path_in_stage_code_is_followed() -> None:
    """The scanner follows `Path(__file__)...` chains and imports by constant names; a stage module
    that made a path or imported a module some other way (os.path.join, .glob, an f-string,
    import_module(variable)) would run code or read files no key names, unless its line says
    why not with a `# codedeps:` comment."""
    unfollowed = {}
    for target in TARGETS:
        for entry in _entries(target).values():
            unfollowed.update(codedeps.closure_of(entry.partition(":")[0]).unfollowed)
    unfollowed.update(codedeps.closure_of(codedeps.STAGE_HOST).unfollowed)
    assert unfollowed == {}


def _scan_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    codedeps.clear_memo()
    return tmp_path.resolve()


MOD = """import os
from pathlib import Path
HERE: Path = Path(__file__).parent
DATA = HERE / 'data' / 'x.json'
OTHER = os.path.join(os.path.dirname(__file__), 'y.json')
ALL = sorted(HERE.glob('*.txt'))
def f():
    here = Path(__file__).parent / 'assets'
    return here
def g():
    here = Path(__file__).parent / 'notes'
    return here
"""
USER = """from pkg.mod import HERE
from pkg import mod
T = HERE / 'data' / 't.txt'
U = HERE.parent
V = mod.f()
"""


def test_the_scanner_follows_paths_and_flags_what_it_cannot(tmp_path: Path) -> None:
    root = _scan_tree(tmp_path, {
        "pkg/__init__.py": "", "pkg/mod.py": MOD, "pkg/user.py": USER,
        "pkg/data/x.json": "{}", "pkg/data/t.txt": "", "pkg/assets/a.bin": "", "pkg/notes/n.txt": "",
    })
    closure = codedeps.closure_of("pkg.user", root)
    assert {"pkg/data/x.json", "pkg/data/t.txt", "pkg/assets/a.bin", "pkg/notes/n.txt"} <= set(closure.files)
    assert closure.unfollowed == {"pkg/mod.py": (5, 6), "pkg/user.py": (4,)}


ENTRY = """from typing import TYPE_CHECKING
import importlib
from . import rel
from pkg.star import *
import pkg.named as n
if TYPE_CHECKING:
    import pkg.typing_only
CMD = ['python', '-m', 'pkg.dashm']
SCRIPT = f'''
import sys
from pkg import script
print({1})
'''
def later(name):
    return importlib.import_module(name)
"""


def test_the_scanner_follows_imports_in_every_form(tmp_path: Path) -> None:
    root = _scan_tree(tmp_path, {
        "pkg/__init__.py": "def __getattr__(name):\n    from pkg import lazy\n    return lazy\n",
        "pkg/lazy.py": "", "pkg/rel.py": "", "pkg/star/__init__.py": "", "pkg/star/s1.py": "",
        "pkg/dashm.py": "", "pkg/script.py": "", "pkg/named.py": "", "pkg/typing_only.py": "",
        "pkg/entry.py": ENTRY,
    })
    closure = codedeps.closure_of("pkg.entry", root)
    for rel in ("lazy", "rel", "star/s1", "dashm", "script", "named"):
        assert f"pkg/{rel}.py" in closure.files, rel
    assert "pkg/typing_only.py" not in closure.files
    assert closure.unfollowed == {"pkg/entry.py": (15,)}


def test_a_scan_depends_on_where_the_file_is(tmp_path: Path) -> None:
    """Two copies of one module, each importing its own package's helper: each reaches its own."""
    root = _scan_tree(tmp_path, {"p1/__init__.py": "", "p2/__init__.py": "", "p1/h.py": "", "p2/h.py": "",
                                 "p1/m.py": "from . import h\n", "p2/m.py": "from . import h\n"})
    assert "p1/h.py" in codedeps.code_closure("p1.m", root)
    assert "p2/h.py" in codedeps.code_closure("p2.m", root)
    assert "p1/h.py" not in codedeps.code_closure("p2.m", root)


# (stage, target) -> the files its items need, and one of the other target's it must not
ITEM_CODE = {("autotune", "cpu"): ("tasks/targets/cpu/tune.py", "tasks/targets/cuda/tune.py"),
             ("autotune", "cuda"): ("tasks/targets/cuda/tune.py", "tasks/targets/cpu/tune.py"),
             ("link", "cpu"): ("tasks/link/runtime.py", "tasks/targets/cuda/link.py"),
             ("link", "cuda"): ("runtime/kiln_safetensors.h", "tasks/targets/cpu/link.py")}


@pytest.mark.parametrize(("stage", "target"), sorted(ITEM_CODE))
def test_the_code_digest_items_are_keyed_by_covers_the_code_that_makes_them(tree: Path, stage: str,
                                                                             target: str) -> None:
    """A kernel's tuning and kiln's runtime objects are cache items of their own, keyed by the
    stage's code digest (StageJob.code): an edit of the tuner or of a runtime header must change
    it, an edit of a stage it does not run, or of another target's code, must not."""
    entry = _entries(target)[stage]
    codedeps.clear_memo()
    before = codedeps.stage_code_digest(entry, tree)
    needed, other_target = ITEM_CODE[(stage, target)]
    for rel, changes in [(needed, True), (other_target, False), ("tasks/lower/stage.py", False)]:
        path = tree / rel
        original = path.read_bytes()
        path.write_bytes(original + b"\n")
        try:
            codedeps.forget_files()
            assert (codedeps.stage_code_digest(entry, tree) != before) is changes, rel
        finally:
            path.write_bytes(original)
    with pytest.raises(ValueError, match="not a module"):
        codedeps.stage_code_digest("__main__:run", tree)




def test_the_runtime_objects_are_keyed_by_their_builder_alone(tree: Path) -> None:
    """link's runtime objects are built by tasks/link/runtime.py (ahead, or by link): their key
    is that module's closure, the same for both targets, which holds runtime/ and the flags."""
    link = next(s for s in STAGES if s.name == "link")
    assert link.prebuild == "tasks.link.runtime"
    codedeps.clear_memo()
    before = codedeps.stage_code_digest(f"{link.prebuild}:main", tree)
    edits = [("runtime/kiln_safetensors.h", True), ("contract/toolchain.py", True),
             ("tasks/targets/cpu/link.py", False), ("tasks/targets/cuda/link.py", False),
             ("tasks/link/stage.py", False)]
    for rel, changes in edits:
        path = tree / rel
        original = path.read_bytes()
        path.write_bytes(original + b"\n")
        try:
            codedeps.forget_files()
            assert (codedeps.stage_code_digest(f"{link.prebuild}:main", tree) != before) is changes, rel
        finally:
            path.write_bytes(original)
