from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.config import PROJECT_ROOT
from pipeline.build import Cache

# Note: no stage server (pipeline/server.py) for the tests' compiles: each test's would outlive it,
# holding its imports, by the hundred. tests/test_server.py turns it on for its own.
os.environ["KILN_SERVER"] = "0"

MLP_CONFIG = """
[model]
factory = "toymodel:build"
kwargs = {{ width = {width} }}

[[inputs]]
name = "x"
shape = [4, 8]
dtype = "float32"

[weights]
seed = 0
{extra}
"""

TOY_MODEL = '''
import torch


# A comment that tests edit.
class Toy(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, width)
        self.b = torch.nn.Linear(width, 3)

    def forward(self, x):
        return torch.softmax(self.b(torch.relu(self.a(x))), dim=-1)


def build(width: int = 16) -> Toy:
    return Toy(width)
'''


def python_path() -> str:
    """kiln's root first, then whatever PYTHONPATH the caller had (the GPU box's wheels)."""
    return os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[Cache]:
    c = Cache.open(tmp_path / "cache")
    yield c
    c.records.close()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A model project of its own: configs/toy.toml and toymodel.py."""
    root = tmp_path / "proj"
    (root / "configs").mkdir(parents=True)
    (root / "toymodel.py").write_text(TOY_MODEL)
    write_config(root, "toy")
    return root


def write_config(root: Path, name: str, width: int = 16, extra: str = "") -> Path:
    path = root / "configs" / f"{name}.toml"
    path.write_text(MLP_CONFIG.format(width=width, extra=extra))
    return path


def kiln(args: list[str], cache_dir: Path, cwd: Path | None = None,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, KILN_CACHE_DIR=str(cache_dir), COLUMNS="200")
    env["PYTHONPATH"] = python_path()
    proc = subprocess.run(
        [sys.executable, "-m", "kiln", *args], capture_output=True, text=True,
        env=env, cwd=cwd or PROJECT_ROOT, timeout=600, check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"kiln {args} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """gpu-marked tests skip, with a reason, where no GPU is visible."""
    from contract.facts import gpu_visible

    if gpu_visible():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (make test-gpu on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
