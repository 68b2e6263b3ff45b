"""Keys that cannot lie about in-memory modules: pipeline.compile on one shared cache, in one
process and across two, must give every module its own build (tests/live_cases.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from contract.config import PROJECT_ROOT
from contract.errors import KilnError
from kiln import compile as kiln_compile
from kiln import load
from tests import live_cases
from tests.live_cases import ONE_OPS, Helped, OneOp, check, pairs, shared_linear


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("live") / "cache"


@pytest.mark.parametrize("name", sorted(pairs(shared_linear())))
def test_a_pair_gets_two_builds_in_one_process(name: str, cache_dir: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Both sides compile into the default folder, build/<class>: the second build replaces the
    first there, and loading it runs the second's code."""
    monkeypatch.chdir(tmp_path)
    first, second = pairs(shared_linear())[name]
    x = torch.randn(4, 16)
    for module in (first, second):
        compiled = kiln_compile(module, (x,), target="cpu", cache_dir=cache_dir)
        fresh = torch.randn(4, 16)
        torch.testing.assert_close(compiled(fresh), module(fresh))


def test_a_global_read_by_a_helper_changed_in_one_process(cache_dir: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    module, x = Helped(shared_linear()), torch.randn(4, 16)
    assert check(module, x, cache_dir, tmp_path / "before") < 1e-5
    monkeypatch.setattr(live_cases, "SCALE", live_cases.SCALE + 1.0)
    assert check(module, x, cache_dir, tmp_path / "after") < 1e-5


def test_one_op_wrappers_of_one_class_in_a_row(cache_dir: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    x = torch.randn(4, 6)
    for fn in ONE_OPS:
        module = OneOp(fn)
        compiled = kiln_compile(module, (x,), target="cpu", cache_dir=cache_dir)
        got, want = compiled(x), module(x)
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
        torch.testing.assert_close(got, want)


def test_pairs_across_two_processes(tmp_path: Path) -> None:
    """Side 0 then side 1 of every pair on one cache, each in a process of its own; the helper's
    global differs between the processes while its source file does not."""
    cache = tmp_path / "cache"
    for side, scale in ((0, "2.0"), (1, "3.0")):
        env = dict(os.environ, KILN_TEST_SCALE=scale)
        cmd = [sys.executable, "-m", "tests.live_cases", str(cache), str(tmp_path / f"side{side}"), str(side)]
        proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, f"side {side}:\n{proc.stdout}\n{proc.stderr[-3000:]}"


def test_an_unchanged_module_is_traced_again_and_cut_off_below(cache_dir: Path, tmp_path: Path) -> None:
    module, x = torch.nn.Sequential(shared_linear(), torch.nn.Tanh()), torch.randn(4, 16)
    for out in (tmp_path / "first", tmp_path / "second"):
        kiln_compile(module, (x,), target="cpu", cache_dir=cache_dir, out=out)
    first, second = (json.loads((tmp_path / d / "report.json").read_text())["stages"]
                     for d in ("first", "second"))
    status = {row["stage"]: row["status"] for row in second}
    assert status.pop("trace") == "ran"
    assert status.pop("weights") == "ran"  # a module's tensors are keyed by the file they make
    assert set(status.values()) == {"cutoff"}, status
    assert [row["key"] for row in first] == [row["key"] for row in second]  # trace's too: its output's


def test_new_weights_give_a_new_trace_and_nothing_new_below(cache_dir: Path, tmp_path: Path) -> None:
    lin, x = shared_linear(), torch.randn(4, 16)
    module = torch.nn.Sequential(lin, torch.nn.Softplus())
    kiln_compile(module, (x,), target="cpu", cache_dir=cache_dir, out=tmp_path / "a")
    with torch.no_grad():
        lin.weight.mul_(-1)
    compiled = kiln_compile(module, (x,), target="cpu", cache_dir=cache_dir, out=tmp_path / "b")
    torch.testing.assert_close(compiled(x), module(x))
    stages = json.loads((tmp_path / "b" / "report.json").read_text())["stages"]
    assert {row["stage"]: row["status"] for row in stages}["link"] == "cutoff"


def test_a_folder_that_is_not_a_build_is_a_clear_error_naming_it(tmp_path: Path) -> None:
    """A damaged model.so in a real build is tests/test_faults.py's; here the folder holds
    no manifest, so load() names the folder and says to recompile."""
    (tmp_path / "model.so").write_bytes(b"not a shared library")
    (tmp_path / "weights.safetensors").write_bytes(b"")
    with pytest.raises(KilnError, match=f"{tmp_path} has no model.json(.|\n)*recompile"):
        load(tmp_path)


class Transposed(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sum(0)


def test_example_input_strides_are_in_the_key_and_any_layout_runs(cache_dir: Path, tmp_path: Path) -> None:
    """A non-contiguous example input is a different program from a contiguous one; either
    build runs inputs of either layout (the runtime copies one it was not built for)."""
    base = torch.randn(6, 5)
    module = Transposed()
    built_t = kiln_compile(module, (base.t(),), target="cpu", cache_dir=cache_dir, out=tmp_path / "t")
    built_c = kiln_compile(module, (base.t().contiguous(),), target="cpu", cache_dir=cache_dir,
                           out=tmp_path / "c")
    assert built_t.inputs[0].stride == (1, 5)
    assert built_c.inputs[0].stride == (6, 1)
    for built in (built_t, built_c):
        for arg in (base.t(), base.t().contiguous()):
            torch.testing.assert_close(built(arg), module(arg))


class DataDependent(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # export cannot trace a branch on a tensor's value
            return x + 1
        return x - 1


def test_a_module_export_cannot_trace_names_its_line(cache_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(KilnError) as err:
        kiln_compile(DataDependent(), (torch.randn(3),), target="cpu", cache_dir=cache_dir,
                     out=tmp_path / "dd")
    assert "torch.export failed" in str(err.value)
    assert "test_live_keys.py" in str(err.value)
    assert "if x.sum() > 0" in str(err.value)
    assert "torch.cond or torch.where" in err.value.hint
