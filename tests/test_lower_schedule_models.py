"""Every reference config lowers and schedules through the real stages, and the IR interpreter,
run on the lowered graph and on the schedule (arena and all), matches eager PyTorch."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from contract.config import load_config
from pipeline.build import Cache, compile_model
from pipeline.runner import BuildOptions
from tasks.ir import serialize
from tasks.ir.interpret import run_graph
from tasks.ir.nodes import BufferKind, Graph
from tasks.ir.oracle import flat_outputs
from tasks.ir.verify import verify
from tasks.schedule import model
from tasks.schedule.run import run_schedule
from tasks.schedule.verify import verify_schedule

# bert and gpt2 are full-size (make test-slow): their small configs run the same code in make test
MODELS = ["mlp", "convnet", "cond", "while", "bert-small", "gpt2-small", "resnet18",
          *(pytest.param(name, marks=pytest.mark.slow) for name in ("bert", "gpt2"))]
_PACKAGES = {"bert": "transformers", "gpt2": "transformers", "resnet18": "torchvision"}


def _needs(name: str) -> None:
    for prefix, package in _PACKAGES.items():
        if name.startswith(prefix) and importlib.util.find_spec(package) is None:
            pytest.skip(f"{name} needs {package}, which is not installed here")


def _args(graph: Graph, inputs: tuple[torch.Tensor, ...], weights: dict[str, torch.Tensor]) -> dict[str, Any]:
    user = iter(inputs)
    return {b.name: weights[b.weight] if b.kind is BufferKind.WEIGHT else next(user) for b in graph.inputs}


def _close(got: list[torch.Tensor], want: list[torch.Tensor], what: str) -> None:
    assert len(got) == len(want), what
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("name", MODELS)
def test_reference_model_lowers_schedules_and_matches_eager(name: str, cache: Cache, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from tasks.trace.factory import build_model, example_inputs

    _needs(name)
    config = load_config(name)
    result = compile_model(config, BuildOptions("cpu", tmp_path / name, until="schedule"), cache)
    assert [r.status for r in result.rows[:4]] == ["ran", "ran", "ran", "ran"]
    graph = serialize.loads(result.entries["lower"].file("ir.json").read_bytes())
    verify(graph)
    schedule = model.schedule_from(json.loads(result.entries["schedule"].file("schedule.json").read_bytes()))
    verify_schedule(schedule)
    weights = load_file(result.entries["weights"].file("weights.safetensors"))
    inputs = example_inputs(config.field("inputs"), config.field("weights.seed"))
    module = build_model(config.fields, name, config.project_root)
    with torch.no_grad():
        want = [t.contiguous() for t in flat_outputs(module(*inputs))]
    args = _args(graph, inputs, weights)
    _close(run_graph(graph, args), want, f"{name}: lowered graph")
    _close(run_schedule(schedule, args), want, f"{name}: schedule")


def test_attention_reads_its_projections_and_its_result_without_a_copy() -> None:
    """gpt2's attention, float32: one linear layer makes query, key and value, split in three and
    read by attention through views, so its bias stays in addmm (no kernel of kiln's reads the
    product: tasks/lower/consumers.py); attention's result is laid out as torch's kernels write
    it, so the heads' merge before the output projection is a view (tasks/lower/externs.py)."""
    import torch.nn.functional as F

    from tasks.ir.nodes import Extern, ExternOp
    from tasks.schedule.model import CallStep
    from tests.schedule_harness import compile_fn

    qkv, proj = torch.nn.Linear(32, 96), torch.nn.Linear(32, 32)

    def block(x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.view(2, 8, 4, 8).transpose(1, 2) for t in qkv(x).split(32, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: torch.Tensor = proj(y.transpose(1, 2).reshape(2, 8, 32))
        return out

    with torch.no_grad():
        schedule = compile_fn(block, torch.randn(2, 8, 32)).schedule
    calls = [s.node.op for s in schedule.main.steps if isinstance(s, CallStep) and isinstance(s.node, Extern)]
    assert calls[:2] == [ExternOp.ADDMM, ExternOp.SDPA], calls
    assert len(schedule.kernels) == 1, [k.origins for k in schedule.kernels]  # the output projection's bias
