"""Every reference config traces (in a worker, as `make compile` does) and reads back."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from contract.config import load_config
from pipeline.build import Cache, compile_model
from pipeline.runner import BuildOptions

SMALL = ["mlp", "convnet", "cond", "while", "bert-small", "gpt2-small"]


@pytest.mark.parametrize("name", SMALL)
def test_reference_config_traces(name: str, cache: Cache, tmp_path: Path) -> None:
    from tasks.trace.program import load_program

    if "bert" in name or "gpt2" in name:
        pytest.importorskip("transformers")
    # Note: trace only; the whole compile of each of these is test_end_to_end's
    result = compile_model(load_config(name), BuildOptions("cpu", tmp_path / name, until="weights"), cache)
    assert [row.status for row in result.rows[:2]] == ["ran", "ran"]
    assert "built" not in result.entries["trace"].meta["notes"]  # built without weights
    program = load_program(result.entries["trace"].file("program.json"))
    assert len(program.graph.nodes) > 3
    assert result.entries["weights"].file("weights.safetensors").stat().st_size > 0


def test_control_flow_survives_in_the_program(cache: Cache, tmp_path: Path) -> None:
    for name, op in (("cond", "torch.ops.higher_order.cond"),
                     ("while", "torch.ops.higher_order.while_loop")):
        result = compile_model(load_config(name), BuildOptions("cpu", tmp_path / name, until="trace"), cache)
        assert op in result.entries["trace"].file("program.json").read_text()


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None,
                    reason="torchvision is installed here")
def test_resnet18_without_torchvision_names_the_package(cache: Cache, tmp_path: Path) -> None:
    from contract.errors import KilnError

    with pytest.raises(KilnError, match="needs the Python package 'torchvision'"):
        compile_model(load_config("resnet18"), BuildOptions("cpu", tmp_path / "r"), cache)
