"""The scheduler: named, pure passes in a straight line, for the main graph and every subgraph.

    eliminate_dead -> inline_pointwise -> fuse -> make_kernel -> plan_arena

Each pass's result is kept as text (numbered per graph) for the debug dump, with the reason
for every refused inline or fusion.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from tasks.ir.nodes import (
    Buffer,
    Cond,
    Extern,
    Fallback,
    Graph,
    Scatter,
    While,
    children,
    control_reads,
    node_inputs,
    with_children,
)
from tasks.ir.text import graph_text
from tasks.schedule.epilogues import product_param
from tasks.schedule.fuse import Unit, fuse
from tasks.schedule.inline import Decisions, eliminate_dead, inline_pointwise
from tasks.schedule.kernels import make_kernel
from tasks.schedule.model import (
    CallStep,
    Kernel,
    KernelStep,
    Schedule,
    ScheduledGraph,
    Step,
)
from tasks.schedule.plan import Interval, plan_arena
from tasks.schedule.text import kernel_text


@dataclass
class Run:
    """What scheduling a program accumulates across its graphs."""

    kernels: list[Kernel] = field(default_factory=list)
    dumps: dict[str, str] = field(default_factory=dict)


def schedule_program(graph: Graph) -> tuple[Schedule, dict[str, str]]:
    run = Run()
    main = schedule_graph(graph, "main", run)
    return Schedule(main, tuple(run.kernels)), run.dumps


def schedule_graph(graph: Graph, label: str, run: Run) -> ScheduledGraph:
    decisions = Decisions()
    run.dumps[f"{label}/00-lowered.txt"] = graph_text(graph)
    live = eliminate_dead(graph)
    run.dumps[f"{label}/01-dead-code.txt"] = graph_text(live)
    inlined = inline_pointwise(live, decisions)
    run.dumps[f"{label}/02-inline.txt"] = graph_text(inlined)
    units = fuse(inlined.nodes, decisions)
    stored = stored_buffers(units, inlined.outputs)
    buffers = inlined.buffers()
    steps = [make_step(u, stored, buffers, label, run) for u in units]
    run.dumps[f"{label}/03-kernels.txt"] = "\n".join(
        kernel_text(run.kernels[int(s.kernel[1:])]) for s in steps if isinstance(s, KernelStep))
    run.dumps[f"{label}/refused.txt"] = "".join(f"{line}\n" for line in decisions.refused)
    return planned(inlined, steps, run, matmul_epilogues(inlined, steps, run))


def matmul_epilogues(graph: Graph, steps: list[Step], run: Run) -> tuple[int, ...]:
    """The matmul calls whose product only the next step reads, as its epilogue kernel
    (tasks/schedule/epilogues.py): their step indices."""
    readers: dict[str, list[int]] = {}
    for n, step in enumerate(steps):
        for name in step_io(step, run)[0]:
            readers.setdefault(name, []).append(n)
    kernels = {k.name: k for k in run.kernels}
    found = []
    for i, (step, after) in enumerate(itertools.pairwise(steps)):
        if not (isinstance(step, CallStep) and isinstance(after, KernelStep)):
            continue
        if not isinstance(step.node, Extern):
            continue
        product = step.node.out.name
        if product in graph.outputs or readers.get(product) != [i + 1]:
            continue
        if product_param(step.node, kernels[after.kernel]) is not None:
            found.append(i)
    return tuple(found)


def stored_buffers(units: list[Unit], outputs: tuple[str, ...]) -> set[str]:
    """Buffers a kernel must write to memory: read by another step, or returned."""
    stored = set(outputs)
    for unit in units:
        for other in units:
            if other is not unit:
                stored.update(b for b in other.reads if b in unit.writes)
    return stored


def make_step(unit: Unit, stored: set[str], buffers: dict[str, Buffer], label: str, run: Run) -> Step:
    node = unit.nodes[0]
    if unit.kernel or isinstance(node, Scatter):
        kernel = make_kernel(unit, f"k{len(run.kernels)}", stored, buffers)
        run.kernels.append(kernel)
        return KernelStep(kernel.name)
    if isinstance(node, Extern | Fallback):
        return CallStep(node)
    def sub(graph: Graph, part: str) -> ScheduledGraph:
        return schedule_graph(graph, f"{label}.{node.origin}.{part}", run)

    assert isinstance(node, Cond | While)
    return with_children(node, [sub(graph, part) for part, graph in children(node)])


def step_io(step: Step, run: Run) -> tuple[list[str], list[str]]:
    """(buffers read, buffers written) by a step."""
    if isinstance(step, KernelStep):
        k = next(k for k in run.kernels if k.name == step.kernel)
        reads = [p.buffer for p in k.params if p.role in ("in", "inout")]
        return reads, [p.buffer for p in k.params if p.role in ("out", "inout")]
    if isinstance(step, CallStep):
        return node_inputs(step.node), [b.name for b in step.node.outs]
    return [v.buffer for v in control_reads(step)], [b.name for b in step.outs]


def liveness(steps: tuple[Step, ...] | list[Step], run: Run,
             epilogues: tuple[int, ...] = ()) -> tuple[dict[str, int], dict[str, int]]:
    """For each buffer a step writes: the first step writing it and the last step touching it.
    A matmul's epilogue kernel counts as reading the matmul's inputs too (epilogues.py)."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, step in enumerate(steps):
        reads, writes = step_io(step, run)
        if i - 1 in epilogues:
            reads = reads + step_io(steps[i - 1], run)[0]
        for name in writes:
            first.setdefault(name, i)
            last.setdefault(name, i)
        for name in reads:
            last[name] = i
    return first, last


def planned(graph: Graph, steps: list[Step], run: Run, epilogues: tuple[int, ...] = ()) -> ScheduledGraph:
    first, last = liveness(steps, run, epilogues)
    all_buffers = graph.buffers()
    written = [all_buffers[name] for name in first]
    arena = [Interval(b, first[b.name], last[b.name]) for b in written if b.name not in graph.outputs]
    offsets, size = plan_arena(arena)
    return ScheduledGraph(graph.inputs, graph.outputs, tuple(steps), tuple(written),
                          tuple(sorted(offsets.items())), size, graph.writes, epilogues)

