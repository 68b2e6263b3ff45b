"""gen-tuning-code and autotune as stages: published tuning code, decisions apart from timings,
and a cache per kernel, so an edit to one layer re-tunes only that layer's kernels."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from contract.config import PROJECT_ROOT
from tests.conftest import kiln

LAYERS_MODEL = '''
import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.width = width

    def forward(self, x):
        return F.layer_norm(x + torch.tanh(self.fc(x)) * self.width, (8,))


def build(width: int = 16):
    return torch.nn.Sequential(Block(1), Block(2), Block(3))
'''


def _rows(project: Path) -> dict[str, dict[str, str]]:
    report = json.loads((project / "build" / "toy" / "report.json").read_text())
    return {row["stage"]: row for row in report["stages"]}


def test_one_layer_edit_retunes_only_its_kernels(project: Path, tmp_path: Path) -> None:
    model = project / "toymodel.py"
    model.write_text(LAYERS_MODEL)
    cache = tmp_path / "cache"
    kiln(["compile", "toy", "--target", "cpu", "--until", "autotune"], cache, cwd=project)
    rows = _rows(project)
    assert rows["autotune"]["note"] == "kernels tuned 3 of 3 (0 cached)"
    build = project / "build" / "toy"
    assert (build / "tune.py").is_file()
    assert (build / "kernels.json").is_file()
    assert any((build / "kernels").rglob("*.cpp"))
    model.write_text(LAYERS_MODEL.replace("Block(2), Block(3)", "Block(2), Block(5)"))
    kiln(["compile", "toy", "--target", "cpu", "--until", "autotune"], cache, cwd=project)
    rows = _rows(project)
    assert rows["autotune"]["status"] == "ran"
    assert rows["autotune"]["note"] == "kernels tuned 3 of 3 (2 cached)"


def test_the_cuda_target_builds_and_links_through_the_cli(project: Path, tmp_path: Path) -> None:
    kiln(["compile", "toy", "--target", "cuda"], tmp_path / "cache", cwd=project)
    rows = _rows(project)
    assert rows["autotune"]["status"] == "ran"
    assert rows["gen-cpp"]["status"] == "ran"
    assert rows["link"]["status"] == "ran"
    assert (project / "build" / "toy" / "model.so").is_file()


def test_stages_after_lower_start_without_torch() -> None:
    """Each stage runs in a fresh worker, and importing torch costs that worker seconds: only
    trace and lower need it (the CPU tuner imports it when it runs, the cuda one never)."""
    entries = ["tasks.schedule.stage", "tasks.targets.cpu.kernels", "tasks.targets.cuda.kernels",
               "tasks.targets.cuda.autotune", "tasks.targets.cpu.launch", "tasks.targets.cuda.launch",
               "tasks.targets.cpu.link", "tasks.targets.cuda.link"]
    code = (f"import importlib, sys; [importlib.import_module(m) for m in {entries!r}]; "
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=PROJECT_ROOT)
    assert proc.stdout.strip() == "False"
