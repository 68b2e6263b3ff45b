"""Export a function, lower it, schedule it, and check the result against eager: for tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tasks.ir import serialize
from tasks.ir.interpret import run_graph
from tasks.ir.nodes import Graph
from tasks.ir.oracle import export, flat_outputs, graph_args, program_data
from tasks.ir.verify import verify
from tasks.lower.program import lower_program
from tasks.schedule import model
from tasks.schedule.model import CallStep, KernelStep, Schedule
from tasks.schedule.passes import schedule_program
from tasks.schedule.run import run_schedule
from tasks.schedule.verify import verify_schedule


@dataclass
class Compiled:
    graph: Graph
    schedule: Schedule
    dumps: dict[str, str]

    @property
    def kernels(self) -> int:
        return len(self.schedule.kernels)

    @property
    def calls(self) -> int:
        return sum(isinstance(s, CallStep) for s in self.schedule.main.steps)

    def launches(self) -> list[str]:
        return [s.kernel for s in self.schedule.main.steps if isinstance(s, KernelStep)]


def compile_fn(fn: Callable[..., Any] | torch.nn.Module, *inputs: torch.Tensor,
               rtol: float = 1e-4, atol: float = 1e-5, layout: str = "traced") -> Compiled:
    """Lower and schedule fn; check both the lowered graph and the schedule against eager.
    layout: lower.layout ("auto": the cuda target's default)."""
    program = export(fn, inputs)
    graph = lower_program(program_data(program), {}, layout)
    verify(graph)
    schedule, dumps = schedule_program(graph)
    verify_schedule(schedule)
    assert serialize.loads(serialize.dumps(graph)) == graph
    assert model.dumps(model.schedule_from(_json(model.dumps(schedule)))) == model.dumps(schedule)
    args = graph_args(graph, program, inputs)
    with torch.no_grad():
        want = [t.contiguous() for t in flat_outputs(fn(*inputs))]
    for got in (run_graph(graph, args), run_schedule(schedule, args)):
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=True)
    return Compiled(graph, schedule, dumps)


def _json(data: bytes) -> Any:
    import json

    return json.loads(data)
