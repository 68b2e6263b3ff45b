"""The trace stage for real: deterministic artifacts, depfile keys, checkpoints, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from contract.config import load_config
from pipeline.build import Cache, compile_model
from pipeline.runner import BuildOptions, BuildResult
from pipeline.stages import STAGES
from tasks.trace.factory import shown_path
from tests.conftest import kiln, python_path, write_config
from tests.fake_stages import with_consumer

TRACE_AND_CONSUMER = with_consumer(STAGES)


def _compile(project: Path, cache: Cache, name: str = "toy", **opts: object) -> BuildResult:
    config = load_config(str(project / "configs" / f"{name}.toml"))
    options = BuildOptions("cpu", project / "build" / name, **opts)  # type: ignore[arg-type]
    return compile_model(config, options, cache, stages=TRACE_AND_CONSUMER)


def _status(result: BuildResult) -> dict[str, str]:
    return {row.stage: row.status for row in result.rows}


def _artifacts(result: BuildResult) -> dict[str, str]:
    return {n: a.digest for n, a in result.entries["trace"].artifacts.items()}


def test_trace_is_deterministic_across_processes(project: Path, cache: Cache) -> None:
    first = _compile(project, cache)
    again = _compile(project, cache, force=frozenset({"trace"}))
    assert _status(again) == {"trace": "ran", "weights": "cutoff", "consume": "cutoff"}
    assert _artifacts(first) == _artifacts(again)
    program = json.loads(first.entries["trace"].file("program.json").read_text())
    assert "stack_trace" not in json.dumps(program)
    assert str(project) not in first.entries["trace"].file("program.json").read_text()


def test_noop_compile_hits_and_depfile_lists_model_source(project: Path, cache: Cache) -> None:
    first = _compile(project, cache)
    deps = first.entries["trace"].meta["notes"]["depfile"]
    assert "toymodel.py" in deps["files"]
    again = _compile(project, cache)
    assert _status(again) == {"trace": "hit", "weights": "hit", "consume": "hit"}


def test_comment_edit_reruns_trace_only(project: Path, cache: Cache) -> None:
    first = _compile(project, cache)
    model = project / "toymodel.py"
    model.write_text(model.read_text().replace("# A comment that tests edit.",
                                               "# An edited comment\n# spanning two lines."))
    result = _compile(project, cache)
    # the weights stage's init runs the model's code, so its sources are its key
    assert _status(result) == {"trace": "ran", "weights": "ran", "consume": "cutoff"}
    assert _artifacts(result)["program.json"] == _artifacts(first)["program.json"]
    source_map = json.loads(result.entries["trace"].file("source_map.json").read_text())
    assert any(line.startswith("toymodel.py:") for line in source_map.values())


def test_code_edit_changes_the_program(project: Path, cache: Cache) -> None:
    first = _compile(project, cache)
    model = project / "toymodel.py"
    model.write_text(model.read_text().replace("torch.relu", "torch.tanh"))
    result = _compile(project, cache)
    assert _status(result) == {"trace": "ran", "weights": "ran", "consume": "ran"}
    assert _artifacts(result)["program.json"] != _artifacts(first)["program.json"]


def _checkpoint(path: Path, seed: int) -> None:
    torch.manual_seed(seed)
    sys.path.insert(0, str(path.parent))
    try:
        import toymodel  # type: ignore[import-not-found]

        save_file(toymodel.build(16).state_dict(), str(path))
    finally:
        sys.path.remove(str(path.parent))
        sys.modules.pop("toymodel", None)


def test_checkpoint_swap_reruns_the_weights_only(project: Path, cache: Cache) -> None:
    ckpt = project / "ckpt.safetensors"
    _checkpoint(ckpt, seed=1)
    write_config(project, "toy", extra='checkpoint = "../ckpt.safetensors"')
    first = _compile(project, cache)
    weights = load_file(str(first.out / "weights.safetensors"))
    assert torch.equal(weights["a.weight"], load_file(str(ckpt))["a.weight"])
    _checkpoint(ckpt, seed=2)
    result = _compile(project, cache)
    assert _status(result) == {"trace": "hit", "weights": "ran", "consume": "hit"}
    assert _weights(result) != _weights(first)
    assert torch.equal(load_file(str(result.out / "weights.safetensors"))["a.weight"],
                       load_file(str(ckpt))["a.weight"])


def _weights(result: BuildResult) -> str:
    return result.entries["weights"].artifacts["weights.safetensors"].digest


def test_program_loads_back_with_meta_weights(project: Path, cache: Cache) -> None:
    from tasks.trace.program import load_program

    result = _compile(project, cache)
    program = load_program(result.entries["trace"].file("program.json"))
    ops = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert "aten.addmm.default" in ops
    assert all(t.device.type == "meta" for t in program.state_dict.values())


def test_noop_compile_does_not_import_torch(project: Path, tmp_path: Path) -> None:
    cache_dir = tmp_path / "c"
    config = str(project / "configs" / "toy.toml")
    kiln(["compile", config, "--target", "cpu", "--quiet"], cache_dir)
    code = (
        "import sys; from cli.main import main; "
        f"rc = main(['compile', {config!r}, '--target', 'cpu', '--quiet']); "
        "assert rc == 0; assert 'torch' not in sys.modules, 'torch was imported'"
    )
    env = {"KILN_CACHE_DIR": str(cache_dir), "PYTHONPATH": python_path(), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert "hit" in proc.stdout


def _stage_entries(cache_dir: Path) -> list[Path]:
    """The store's stage entries. Per-item entries are left out: kiln's runtime, built ahead
    beside trace (pipeline/prebuild.py), may be whole in the store after trace failed, and is
    any model's."""
    found = (cache_dir / "store" / "objects").glob("*/*")
    return [path for path in found if not path.parent.name.endswith(".items")]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ('factory = "nomodule:build"', "factory module 'nomodule' was not found"),
        ('factory = "toymodel:nothing"', "toymodel has no callable 'nothing'"),
        ("kwargs = { width = -3 }", "factory toymodel:build failed"),
    ],
)
def test_bad_factory_is_a_clear_error(project: Path, tmp_path: Path, edit: str, message: str) -> None:
    path = project / "configs" / "toy.toml"
    text = path.read_text()
    key = edit.split(" = ", maxsplit=1)[0]
    line = next(ln for ln in text.splitlines() if ln.startswith(f"{key} ="))
    path.write_text(text.replace(line, edit))
    proc = kiln(["compile", str(path), "--target", "cpu"], tmp_path / "c", check=False)
    assert proc.returncode == 1
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not _stage_entries(tmp_path / "c")


def test_missing_package_names_it(project: Path, tmp_path: Path) -> None:
    (project / "toymodel.py").write_text("import notapackage_kiln\n" + (project / "toymodel.py").read_text())
    proc = kiln(["compile", str(project / "configs" / "toy.toml")], tmp_path / "c", check=False)
    assert proc.returncode == 1
    assert "needs the Python package 'notapackage_kiln'" in proc.stderr
    assert "pip install notapackage_kiln" in proc.stderr


def test_export_failure_names_the_source_line(project: Path, tmp_path: Path) -> None:
    model = project / "toymodel.py"
    model.write_text(model.read_text().replace(
        "return torch.softmax(", "if x.sum() > 0:\n            x = x * 2\n        return torch.softmax("))
    proc = kiln(["compile", str(project / "configs" / "toy.toml")], tmp_path / "c", check=False)
    assert proc.returncode == 1
    assert "torch.export failed" in proc.stderr
    assert "toymodel.py:" in proc.stderr
    assert not _stage_entries(tmp_path / "c")


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"not a checkpoint", "is not a readable checkpoint"), (None, "does not match the model")],
)
def test_bad_checkpoint_is_a_clear_error(project: Path, tmp_path: Path, content: bytes | None,
                                         message: str) -> None:
    ckpt = project / "ckpt.safetensors"
    if content is None:
        save_file({"a.weight": torch.zeros(2, 2)}, str(ckpt))
    else:
        ckpt.write_bytes(content)
    write_config(project, "toy", extra='checkpoint = "../ckpt.safetensors"')
    proc = kiln(["compile", str(project / "configs" / "toy.toml")], tmp_path / "c", check=False)
    assert proc.returncode == 1
    assert message in proc.stderr


class _Opaque:
    """Not a tensor: torch.load(weights_only=True) refuses a pickle holding one."""


def _unreadable_checkpoints(root: Path) -> dict[str, tuple[Path, str]]:
    """Files that are not checkpoints, and the gist of torch's (or safetensors') reason."""
    files = {"random": (root / "random.pt", "Unsupported operand"),
             "object": (root / "object.pt", "Unsupported global: GLOBAL tests.test_trace._Opaque"),
             "truncated": (root / "truncated.pt", "PytorchStreamReader failed reading zip archive"),
             "empty": (root / "empty.pt", "EOFError"),
             "safetensors": (root / "random.safetensors", "Error while deserializing header")}
    noise = bytes(range(256)) * 4
    files["random"][0].write_bytes(noise)
    files["safetensors"][0].write_bytes(noise)
    files["empty"][0].write_bytes(b"")
    torch.save({"w": torch.ones(2), "opaque": _Opaque()}, files["object"][0])
    whole = root / "whole.pt"
    torch.save({"w": torch.ones(256)}, whole)
    files["truncated"][0].write_bytes(whole.read_bytes()[:-200])
    return files


@pytest.mark.parametrize("kind", ["random", "object", "truncated", "empty", "safetensors"])
def test_unreadable_checkpoint_error_is_short(tmp_path: Path, kind: str) -> None:
    from contract.errors import KilnError
    from tasks.weights.files import read_checkpoint

    path, gist = _unreadable_checkpoints(tmp_path)[kind]
    with pytest.raises(KilnError) as raised:
        read_checkpoint(path, "toy")
    message = raised.value.message
    assert message.startswith(f"model 'toy': {path.name} is not a readable checkpoint: {gist}")
    assert "weights_only" not in str(raised.value)  # never the advice to run the file's code
    assert "\n" not in message
    assert len(message) < 200
    assert ".safetensors file or a torch.save'd state_dict" in raised.value.hint


def test_model_files_are_named_the_same_wherever_the_environment_sits(tmp_path: Path) -> None:
    """source_map.json and trace errors name a package's file from its package folder on, so the
    artifact is the same bytes in any checkout and any venv."""
    for venv in ("/opt/venv", str(tmp_path / ".venv"), "/home/someone/envs/x"):
        path = f"{venv}/lib/python3.11/site-packages/transformers/models/bert/modeling_bert.py"
        assert shown_path(path, tmp_path) == "transformers/models/bert/modeling_bert.py"
    assert shown_path(str(tmp_path / "models" / "toy.py"), tmp_path) == "models/toy.py"
