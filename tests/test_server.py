"""The stage server (pipeline/server.py): a compile after the first runs its stages in workers
forked from a resident process, and builds exactly what fresh workers build; a server whose
imported files changed serves no one; a served worker ends with its runner's connection."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline import server
from pipeline.warm import ServedProc, start_worker, worker_env
from tests.conftest import kiln, write_config


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The server on, its sockets in a short folder of this test's own; removing the folder at
    the end makes the test's server exit (it watches its socket)."""
    folder = Path(tempfile.mkdtemp(prefix="ks", dir="/tmp"))
    monkeypatch.setenv("KILN_SERVER", "1")
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _wait_for_socket(folder: Path, timeout: float = 180.0) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list(folder.glob("kiln-servers-*/*.sock"))
        if found:
            return found[0]
        time.sleep(0.2)
    logs = "\n".join(p.read_text() for p in folder.glob("kiln-servers-*/*.log"))
    raise AssertionError(f"no stage server started:\n{logs}")


def _rows(out: Path) -> dict[str, dict[str, object]]:
    return {row["stage"]: row for row in json.loads((out / "report.json").read_text())["stages"]}


def test_an_edit_after_the_first_compile_runs_in_served_workers_and_builds_the_same(
        project: Path, tmp_path: Path, served: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = project / "configs" / "toy.toml"
    kiln(["compile", str(config), "--target", "cpu", "--out", str(tmp_path / "first")], tmp_path / "cache",
         cwd=project)
    assert not any(row["served"] for row in _rows(tmp_path / "first").values())
    _wait_for_socket(served)
    write_config(project, "toy", width=24)
    kiln(["compile", str(config), "--target", "cpu", "--out", str(tmp_path / "edit")], tmp_path / "cache",
         cwd=project)
    ran = {name: row for name, row in _rows(tmp_path / "edit").items() if row["status"] == "ran"}
    assert ran
    assert all(row["served"] for row in ran.values()), ran
    monkeypatch.setenv("KILN_SERVER", "0")  # the same edit built by fresh workers, in a cache of its own
    kiln(["compile", str(config), "--target", "cpu", "--out", str(tmp_path / "fresh")], tmp_path / "cache2",
         cwd=project)
    fresh = _rows(tmp_path / "fresh")
    assert not any(row["served"] for row in fresh.values())
    assert {name: row["key"] for name, row in ran.items()} == {name: fresh[name]["key"] for name in ran}, \
        [(name, row["key"], fresh[name]["key"]) for name, row in ran.items()]
    for name in ("model.so", "weights.safetensors"):
        assert (tmp_path / "edit" / name).read_bytes() == (tmp_path / "fresh" / name).read_bytes()


def test_a_served_worker_ends_when_its_runners_connection_does(tmp_path: Path, served: Path) -> None:
    server.start(worker_env(), "cpu", "a model")
    _wait_for_socket(served)
    worker = start_worker("tasks.trace.stage:run", "cpu", tmp_path / "log.txt", "a model")
    assert isinstance(worker.proc, ServedProc)
    pid = worker.proc.pid
    assert Path(f"/proc/{pid}").exists()
    worker.proc.conn.close()  # as a runner killed with -9 would
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists()


def test_a_server_whose_imported_files_changed_is_stale(tmp_path: Path) -> None:
    module = tmp_path / "library.py"
    module.write_text("x = 1\n")
    found = server.Server("cpu", "a model", tmp_path)
    found.files = {str(module): server._stamp(str(module))}  # type: ignore[dict-item]
    assert not found.stale()
    module.write_text("x = 22\n")
    assert found.stale()
    module.unlink()
    assert found.stale()


def test_a_kiln_file_saved_while_the_server_imports_it_makes_the_server_stale(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server stamps kiln's files before it imports any: what it runs is the old file."""
    module = tmp_path / "kiln_test_stage_code.py"
    module.write_text("VERSION = 1\n")
    monkeypatch.setattr(server, "_kiln_sources", lambda: [module])
    monkeypatch.syspath_prepend(str(tmp_path))
    found = server.Server("cpu", "a model", tmp_path)
    module.write_text("VERSION = 22\n")  # saved after the stamp, before the import
    import kiln_test_stage_code  # type: ignore[import-not-found]  # noqa: F401

    found._record_files()
    assert found.stale()
    del sys.modules["kiln_test_stage_code"]


def test_no_server_where_it_is_turned_off_or_its_folder_is_not_this_users_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert server.connect({"KILN_SERVER": "0"}, "cpu", "a model", {}) is None
    assert server.enabled({"KILN_SERVER": "1"})
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    (tmp_path / f"kiln-servers-{os.getuid()}").mkdir(mode=0o777)
    os.chmod(tmp_path / f"kiln-servers-{os.getuid()}", 0o777)
    assert server.folder() is None
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path / "file"))  # not a folder
    assert server.folder() is None
    assert server.connect({"KILN_SERVER": "1"}, "cpu", "a model", {}) is None


def test_one_server_per_model_code_whatever_the_shell_changed() -> None:
    env = {"PATH": "/bin", "PWD": "/a", "SHLVL": "1"}
    bert = "proj:models.hf:bert"
    name = server.server_name(env, "/work", "cpu", bert)
    assert server.server_name(env | {"PWD": "/b", "SHLVL": "2"}, "/work", "cpu", bert) == name
    assert server.server_name(env, "/work", "cpu", "proj:models.hf:gpt2") != name
    assert server.server_name(env, "/work", "cuda", bert) != name
    assert server.server_name(env | {"PATH": "/usr/bin"}, "/work", "cpu", bert) != name


def test_a_learned_import_that_starts_cuda_is_never_imported_by_a_server_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stands in for a library whose import starts CUDA: a fork of the server could not use it."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "kiln_test_starts_cuda.py").write_text("STARTED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    monkeypatch.setattr(server, "cuda_started", lambda: "kiln_test_starts_cuda" in sys.modules)
    first = server.Server("cuda", "a model", tmp_path)
    first.learned.write_text("json\nkiln_test_starts_cuda\n")
    first.learn()
    assert first.denied.read_text().split() == ["kiln_test_starts_cuda"]
    del sys.modules["kiln_test_starts_cuda"]
    server.Server("cuda", "a model", tmp_path).learn()
    assert "kiln_test_starts_cuda" not in sys.modules


def test_a_learned_import_that_draws_from_torchs_generator_is_denied(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork of the server would build the model from a generator the import moved before the seed
    (contract/libraries.py: drew_random), where a fresh worker's import moves it after."""
    import torch

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "kiln_test_draws.py").write_text("import torch\nNOISE = torch.rand(1)\n")
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    monkeypatch.delitem(sys.modules, "kiln_test_draws", raising=False)
    # the checks before it, which another test's threads or CUDA would answer first
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setattr(server, "forks_lose_cuda", lambda: False)
    state = torch.random.get_rng_state()
    try:
        learner = server.Server("cpu", "a model", tmp_path)
        learner.learned.write_text("json\nkiln_test_draws\n")
        learner.learn()
    finally:
        torch.random.set_rng_state(state)
        sys.modules.pop("kiln_test_draws", None)
    assert learner.denied.read_text().split() == ["kiln_test_draws"]
    assert "draw from torch's random generator" in learner.unusable


def test_a_server_whose_forks_could_not_use_cuda_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    assert not server.forks_lose_cuda()
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)  # as after cudaGetDeviceCount
    assert server.forks_lose_cuda()  # seen from the probe fork
    monkeypatch.undo()
    monkeypatch.setattr(server, "cuda_started", lambda: True)
    assert server.forks_lose_cuda()


_SERVER_LIKE = """
import os, sys
os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
import torch
from pipeline import server
assert torch.cuda.is_available()
assert not server.forks_lose_cuda(), "a fork after is_available() could not use CUDA"
pid = os.fork()
if pid == 0:
    os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK")
    os._exit(0 if float((torch.ones(4, device="cuda") * 2).sum()) == 8.0 else 3)
sys.exit(os.waitpid(pid, 0)[1] >> 8)
"""


@pytest.mark.gpu
def test_a_fork_of_a_server_that_asked_for_gpus_can_use_cuda() -> None:
    import subprocess

    found = subprocess.run([sys.executable, "-c", _SERVER_LIKE], cwd=Path(__file__).resolve().parents[1],
                           capture_output=True, text=True, timeout=300, check=False)
    assert found.returncode == 0, found.stderr[-2000:]


def test_a_served_worker_collects_garbage_but_never_walks_the_servers_objects(
        tmp_path: Path, served: Path) -> None:
    from contract.job import StageJob

    server.start(worker_env(), "cpu", "a model")
    _wait_for_socket(served)
    worker = start_worker("tests.fake_library_stages:collector", "cpu", tmp_path / "log.txt", "a model")
    assert isinstance(worker.proc, ServedProc)
    control = tmp_path / "control"
    control.mkdir()
    job = StageJob("collector", "m", {}, {}, {}, str(tmp_path), str(tmp_path), str(tmp_path),
                   "tests.fake_library_stages:collector")
    (control / "job.json").write_text(job.to_json())
    worker.hand_over(control)
    assert worker.proc.wait(timeout=60) == 0
    notes = json.loads((control / "result.json").read_text())["notes"]
    assert notes["enabled"] is True
    assert notes["frozen"] > 10_000  # the server's imports: frozen before the fork
