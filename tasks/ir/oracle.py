"""Checks a lowered (or scheduled) graph against eager torch: the harness tests use everywhere."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from tasks.ir.interpret import run_graph
from tasks.ir.nodes import Buffer, BufferKind, Graph


def graph_args(graph: Graph, program: torch.export.ExportedProgram,
               inputs: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Buffer name -> tensor: user inputs in order, weights by their weights-file name."""
    weights = {**program.state_dict, **program.constants}
    user = iter(inputs)
    args: dict[str, torch.Tensor] = {}
    for b in graph.inputs:
        args[b.name] = _laid_out(weights[b.weight], b) if b.kind is BufferKind.WEIGHT else next(user)
    return args


def _laid_out(weight: torch.Tensor, b: Buffer) -> torch.Tensor:
    """The weight in the program's layout, as the runtime lays it out at create."""
    if weight.stride() == b.stride:
        return weight
    return torch.empty_strided(b.shape, b.stride, dtype=weight.dtype).copy_(weight)


def export(module: torch.nn.Module | Callable[..., Any],
           inputs: Sequence[torch.Tensor]) -> torch.export.ExportedProgram:
    from tasks.trace.export import export_program

    if not isinstance(module, torch.nn.Module):
        module = _Wrap(module)
    return export_program(module.eval(), tuple(inputs), "test", Path.cwd())


class _Wrap(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def program_data(program: torch.export.ExportedProgram) -> dict[str, Any]:
    """The program as trace writes it to program.json, parsed: what lower reads."""
    import json

    from tasks.trace.export import program_json

    data: dict[str, Any] = json.loads(program_json(program))
    return data


def flat_outputs(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in flat_outputs(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in flat_outputs(v)]
    return [t for v in vars(value).values() for t in flat_outputs(v)] if hasattr(value, "__dict__") else []


def run_lowered(graph: Graph, program: torch.export.ExportedProgram,
                inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return run_graph(graph, graph_args(graph, program, inputs))
