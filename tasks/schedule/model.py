"""What schedule writes: kernels, the launch order of every graph, and its buffer plan.

A `Kernel` is self-contained: its nodes name only its parameters (in0.., out0..) and locals
(tmp0..), never the graph's buffers, so two layers' identical kernels are equal data with an
equal key, and a later stage can generate, tune and cache a kernel from the kernel alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cache.hashing import canonical_json, digest_json
from tasks.ir.nodes import (
    Buffer,
    Cond,
    Extern,
    Fallback,
    Pointwise,
    Reduction,
    Scatter,
    View,
    While,
    children,
)
from tasks.ir.serialize import (
    buffer_from,
    buffer_json,
    node_from,
    node_json,
    view_from,
    view_json,
)
from tasks.schedule.kernel_loops import KernelStage

KernelNode = Pointwise | Reduction | Scatter


@dataclass(frozen=True, slots=True)
class Param:
    name: str  # in0.., out0..
    buffer: str  # the graph buffer bound to it
    role: str  # "in", "out" or "inout" (a scatter's target)
    spec: Buffer  # named `name`, with the graph buffer's shape, strides and dtype


@dataclass(frozen=True, slots=True)
class Kernel:
    name: str
    origins: tuple[str, ...]  # fx nodes it came from, for people; not in the key
    ranges: tuple[int, ...]  # X: the parallel loops
    reduce_ranges: tuple[int, ...]  # R: the reduction loop, () for a pointwise kernel
    params: tuple[Param, ...]
    locals: tuple[Buffer, ...]  # values that never reach memory (see kernel_loops for their lifetime)
    nodes: tuple[KernelNode, ...]
    stages: tuple[KernelStage, ...]  # the passes over R and the row work between them

    @property
    def key(self) -> str:
        """Structure, shapes, strides and dtypes: never names, origins or weights."""
        return digest_json(kernel_json(self, keyed=True))


@dataclass(frozen=True, slots=True)
class KernelStep:
    kernel: str


@dataclass(frozen=True, slots=True)
class CallStep:
    node: Extern | Fallback


# Note: a control step is the IR's own Cond or While node over scheduled subgraphs (tasks/ir/
# nodes.py: with_children), not a copy of it in another class; walks over subgraphs use the
# one protocol (children) for IR graphs and schedules alike.
CondStep = Cond["ScheduledGraph"]
WhileStep = While["ScheduledGraph"]
ControlStep = CondStep | WhileStep
Step = KernelStep | CallStep | CondStep | WhileStep


@dataclass(frozen=True, slots=True)
class ScheduledGraph:
    """One graph's launch order and memory.

    Note: a subgraph (cond branch, while body) has an arena of its own, used only while its step
    runs; its outputs are "caller" buffers: a cond writes them into the step's outs, a while
    loop into the next iteration's carried values. Since a body may read its carried inputs
    while it writes its outputs (a flip, say), the runtime keeps two sets of carried buffers
    and swaps them after each iteration; the control-flow issue builds that runtime.
    """

    inputs: tuple[Buffer, ...]
    outputs: tuple[str, ...]
    steps: tuple[Step, ...]
    buffers: tuple[Buffer, ...]  # every buffer a step writes
    arena: tuple[tuple[str, int], ...]  # buffer -> byte offset in this graph's arena
    arena_bytes: int
    writes: tuple[str, ...] = ()  # as Graph.writes: where the last outputs are copied after the run
    # matmul calls (step indices) whose next step is their epilogue kernel: tasks/schedule/epilogues.py
    epilogues: tuple[int, ...] = ()

    def user_outputs(self) -> tuple[str, ...]:
        return self.outputs[:len(self.outputs) - len(self.writes)]


@dataclass(frozen=True, slots=True)
class Schedule:
    main: ScheduledGraph
    kernels: tuple[Kernel, ...]  # of every graph, subgraphs included

    def kernel(self, name: str) -> Kernel:
        return next(k for k in self.kernels if k.name == name)


MAIN = "main"  # the place of a kernel launched outside any control flow


def subgraphs(step: Step) -> tuple[tuple[str, ScheduledGraph], ...]:
    """A control-flow step's graphs, each with its place name ("cond_1.then", "while_loop.body")."""
    return tuple((f"{getattr(step, 'origin', '')}.{part}", graph) for part, graph in children(step))


def kernel_places(schedule: Schedule) -> dict[str, tuple[str, ...]]:
    """Kernel name -> where each of its launches sits: MAIN, or a path through control flow
    ("while_loop.body/cond.else"). Every kernel of every branch and body is here, whichever
    branch any input would take."""
    places: dict[str, list[str]] = {}

    def walk(g: ScheduledGraph, place: str) -> None:
        for step in g.steps:
            if isinstance(step, KernelStep):
                places.setdefault(step.kernel, []).append(place)
            for name, sub in subgraphs(step):
                walk(sub, name if place == MAIN else f"{place}/{name}")

    walk(schedule.main, MAIN)
    return {name: tuple(sorted(set(p))) for name, p in places.items()}


def kernels_by_key(schedule: Schedule) -> dict[str, list[Kernel]]:
    """The schedule's kernels grouped by key (equal kernels are generated and tuned once)."""
    groups: dict[str, list[Kernel]] = {}
    for k in schedule.kernels:
        groups.setdefault(k.key, []).append(k)
    return groups


# -- JSON ------------------------------------------------------------------------------------

def kernel_json(k: Kernel, keyed: bool = False) -> dict[str, Any]:
    nodes = [node_json(n) for n in k.nodes]
    if keyed:
        for n in nodes:
            n["origin"] = ""
    params = [{"name": p.name, "role": p.role, "spec": buffer_json(p.spec),
               **({} if keyed else {"buffer": p.buffer})} for p in k.params]
    stages = [{"loop": st.loop, "nodes": list(st.nodes)} for st in k.stages]
    out: dict[str, Any] = {"ranges": list(k.ranges), "reduce_ranges": list(k.reduce_ranges),
                           "params": params, "locals": [buffer_json(b) for b in k.locals], "nodes": nodes,
                           "stages": stages}
    if not keyed:
        out |= {"name": k.name, "origins": list(k.origins), "key": k.key}
    return out


def kernel_from(d: dict[str, Any]) -> Kernel:
    params = tuple(Param(p["name"], p["buffer"], p["role"], buffer_from(p["spec"])) for p in d["params"])
    nodes = tuple(node_from(n) for n in d["nodes"])
    assert all(isinstance(n, Pointwise | Reduction | Scatter) for n in nodes)
    stages = tuple(KernelStage(st["loop"], tuple(st["nodes"])) for st in d["stages"])
    return Kernel(d["name"], tuple(d["origins"]), tuple(d["ranges"]), tuple(d["reduce_ranges"]), params,
                  tuple(buffer_from(b) for b in d["locals"]), nodes, stages)  # type: ignore[arg-type]


def step_json(step: Step) -> dict[str, Any]:
    if isinstance(step, KernelStep):
        return {"kernel": step.kernel}
    if isinstance(step, CallStep):
        return {"call": node_json(step.node)}
    outs = [buffer_json(b) for b in step.outs]
    if isinstance(step, Cond):
        return {"cond": {"pred": view_json(step.pred), "operands": [view_json(v) for v in step.operands],
                         "then": graph_json(step.then_graph), "else": graph_json(step.else_graph),
                         "outs": outs, "origin": step.origin}}
    return {"while": {"carried": [view_json(v) for v in step.carried],
                      "extra": [view_json(v) for v in step.extra], "cond": graph_json(step.cond_graph),
                      "body": graph_json(step.body_graph), "outs": outs, "origin": step.origin}}


def _views(ds: list[Any]) -> tuple[View, ...]:
    return tuple(v for v in (view_from(d) for d in ds) if v is not None)


def step_from(d: dict[str, Any]) -> Step:
    if "kernel" in d:
        return KernelStep(d["kernel"])
    if "call" in d:
        node = node_from(d["call"])
        assert isinstance(node, Extern | Fallback)
        return CallStep(node)
    if "cond" in d:
        c = d["cond"]
        pred = view_from(c["pred"])
        assert pred is not None
        return Cond(pred, _views(c["operands"]), graph_from(c["then"]), graph_from(c["else"]),
                        tuple(buffer_from(b) for b in c["outs"]), c["origin"])
    w = d["while"]
    return While(_views(w["carried"]), _views(w["extra"]), graph_from(w["cond"]), graph_from(w["body"]),
                     tuple(buffer_from(b) for b in w["outs"]), w["origin"])


def graph_json(g: ScheduledGraph) -> dict[str, Any]:
    offsets = dict(g.arena)
    buffers = [buffer_json(b) | {"arena_offset": offsets.get(b.name)} for b in g.buffers]
    return {"inputs": [buffer_json(b) for b in g.inputs], "outputs": list(g.outputs),
            "steps": [step_json(s) for s in g.steps], "buffers": buffers, "arena_bytes": g.arena_bytes} \
        | ({"writes": list(g.writes)} if g.writes else {}) \
        | ({"epilogues": list(g.epilogues)} if g.epilogues else {})


def graph_from(d: dict[str, Any]) -> ScheduledGraph:
    arena = tuple((b["name"], b["arena_offset"]) for b in d["buffers"] if b["arena_offset"] is not None)
    return ScheduledGraph(tuple(buffer_from(b) for b in d["inputs"]), tuple(d["outputs"]),
                          tuple(step_from(s) for s in d["steps"]),
                          tuple(buffer_from(b) for b in d["buffers"]), arena, d["arena_bytes"],
                          tuple(d.get("writes", ())), tuple(d.get("epilogues", ())))


def schedule_json(s: Schedule) -> dict[str, Any]:
    return {"main": graph_json(s.main), "kernels": [kernel_json(k) for k in s.kernels]}


def schedule_from(d: dict[str, Any]) -> Schedule:
    return Schedule(graph_from(d["main"]), tuple(kernel_from(k) for k in d["kernels"]))


def dumps(s: Schedule) -> bytes:
    return canonical_json(schedule_json(s))
