"""CPU tuning code: variants per distinct kernel, a standalone tune.py that times and checks them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from contract.toolchain import host_isa
from tasks.targets.cpu import kernels as cpu
from tests.conftest import python_path
from tests.cpp_kernel_harness import needs_cxx
from tests.schedule_harness import compile_fn


def _block_model() -> torch.nn.Module:
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(64, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = F.layer_norm(x + F.gelu(self.fc(x)), (64,))
            return out

    return torch.nn.Sequential(Block(), Block(), Block())


@needs_cxx
def test_tune_py_runs_standalone_and_picks_a_checked_variant(tmp_path: Path) -> None:
    c = compile_fn(_block_model(), torch.randn(16, 64))
    spec = cpu.write(c.schedule, tmp_path, host_isa())
    assert len(spec.kernels) == 1  # three identical layers: one kernel to tune
    assert list(spec.kernels[0].names) == [k.name for k in c.schedule.kernels]
    proc = subprocess.run([sys.executable, str(tmp_path / "tune.py"), "--repeat", "3"], capture_output=True,
                          text=True, env={"PYTHONPATH": python_path(), "PATH": "/usr/bin:/bin"}, check=False)
    assert proc.returncode == 0, proc.stderr
    records = json.loads((tmp_path / "tuning.json").read_text())
    (record,) = records.values()
    assert record["variant"] in {v.name for v in spec.kernels[0].variants}
    assert all(t is not None for t in record["timings"].values()), record["errors"]


@needs_cxx
def test_a_broken_or_wrong_variant_scores_infinity(tmp_path: Path) -> None:
    from tasks.targets.cpu.tune import tune_kernel

    c = compile_fn(lambda x: torch.softmax(x, -1), torch.randn(8, 33))
    spec = cpu.write(c.schedule, tmp_path, host_isa())
    entry = spec.kernels[0].to_json()
    folder = tmp_path / "kernels"
    wrong, broken = entry["variants"][1], entry["variants"][2]
    text = (folder / wrong["file"]).read_text()
    (folder / wrong["file"]).write_text(text.replace("acc1 += ", "acc1 += 2 * "))
    (folder / broken["file"]).write_text("this is not C++")
    record = tune_kernel(entry, folder, list(spec.compiler), repeat=2)
    assert record["timings"][wrong["name"]] is None
    assert "differ" in record["errors"][wrong["name"]]
    assert record["timings"][broken["name"]] is None
    assert "build failed" in record["errors"][broken["name"]]
    assert record["variant"] not in (wrong["name"], broken["name"])
