"""The lower and schedule stages as the pipeline runs them: bad input, determinism, caching."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from contract.config import load_config
from pipeline.build import Cache, compile_model
from pipeline.runner import BuildOptions
from tests.conftest import kiln

CUSTOM_MODEL = '''
import torch


@torch.library.custom_op("kilntest::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x):
    return torch.empty_like(x)


class M(torch.nn.Module):
    def forward(self, x):
        y = torch.relu(x)
        return twice(y) + 1


def build(width=16):
    return M()
'''


def test_an_unloaded_library_op_names_the_op_and_the_source_line(project: Path, tmp_path: Path) -> None:
    (project / "toymodel.py").write_text(CUSTOM_MODEL)
    proc = kiln(["compile", "toy", "--until", "lower"], tmp_path / "cache", cwd=project, check=False)
    assert proc.returncode != 0
    err = proc.stderr + proc.stdout
    assert "kilntest.twice.default has no lowering and no aten fallback" in err
    assert "toymodel.py:18: return twice(y) + 1" in err
    assert "Traceback" not in err


def test_a_dtype_the_ir_cannot_hold_is_a_clear_error() -> None:
    from tasks.ir.oracle import export, program_data
    from tasks.lower.context import LoweringError
    from tasks.lower.program import lower_program

    program = export(lambda x: x * 2, (torch.randn(3).to(torch.float8_e4m3fn),))
    with pytest.raises(LoweringError, match="dtype float8e4m3fn is not supported"):
        lower_program(program_data(program), {})


def test_lower_and_schedule_are_deterministic_and_cached(cache: Cache, tmp_path: Path) -> None:
    config = load_config("mlp")
    first = compile_model(config, BuildOptions("cpu", tmp_path / "a", until="schedule"), cache)
    again = compile_model(config, BuildOptions("cpu", tmp_path / "b", until="schedule"), cache)
    assert [r.status for r in again.rows[:4]] == ["hit", "hit", "hit", "hit"]
    forced = compile_model(config, BuildOptions("cpu", tmp_path / "c", until="schedule",
                                                force=frozenset({"lower", "schedule"})), cache)
    assert [r.status for r in forced.rows[2:4]] == ["ran", "ran"]
    for stage, name in (("lower", "ir.json"), ("schedule", "schedule.json")):
        assert forced.entries[stage].file(name).read_bytes() == first.entries[stage].file(name).read_bytes()
    assert forced.rows[3].key == first.rows[3].key


def test_a_comment_edit_cuts_off_below_trace(project: Path, tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    kiln(["compile", "toy", "--until", "schedule"], cache_dir, cwd=project)
    model = project / "toymodel.py"
    model.write_text(model.read_text().replace("# A comment that tests edit.", "# An edited comment."))
    kiln(["compile", "toy", "--until", "schedule"], cache_dir, cwd=project)
    report = json.loads((project / "build" / "toy" / "report.json").read_text())
    statuses = {row["stage"]: row["status"] for row in report["stages"]}
    assert statuses["trace"] == "ran"
    assert statuses["lower"] == "cutoff"
    assert statuses["schedule"] == "cutoff"
