"""The schedule as readable text: kernels with their parameters, and each graph's launch order."""

from __future__ import annotations

from tasks.ir.nodes import Cond, While, children
from tasks.ir.text import buffer_type, node_text, view_text
from tasks.schedule.model import CallStep, Kernel, KernelStep, Schedule, ScheduledGraph


def kernel_text(k: Kernel) -> str:
    domain = f"{list(k.ranges)}" + (f" x r{list(k.reduce_ranges)}" if k.reduce_ranges else "")
    lines = [f"kernel {k.name} over {domain}  # {', '.join(k.origins)}"]
    for p in k.params:
        lines.append(f"  {p.role} {p.name}: {buffer_type(p.spec)} stride {list(p.spec.stride)} = {p.buffer}")
    for b in k.locals:
        lines.append(f"  local {b.name}: {buffer_type(b)}")
    if k.reduce_ranges:
        lines.append("  stages: " + " -> ".join(
            f"{'pass' if st.loop else 'row'}[{', '.join(map(str, st.nodes))}]" for st in k.stages))
    for i, node in enumerate(k.nodes):
        lines += node_text(node, "  ", f"[{i}] ")
    return "\n".join(lines) + "\n"


def graph_lines(g: ScheduledGraph, indent: str = "") -> list[str]:
    offsets = dict(g.arena)
    lines = [f"{indent}arena {g.arena_bytes} bytes"]
    for b in g.buffers:
        where = f"arena+{offsets[b.name]}" if b.name in offsets else "caller"
        lines.append(f"{indent}  {b.name}: {buffer_type(b)} at {where}")
    for step in g.steps:
        lines += _step_lines(step, indent)
    lines.append(f"{indent}return {', '.join(g.outputs)}")
    return lines


def _step_lines(step: object, indent: str) -> list[str]:
    if isinstance(step, KernelStep):
        return [f"{indent}launch {step.kernel}"]
    if isinstance(step, CallStep):
        return node_text(step.node, indent)
    outs = ", ".join(b.name for b in step.outs)  # type: ignore[attr-defined]
    if isinstance(step, Cond):
        lines = [f"{indent}{outs} = cond {view_text(step.pred)}"]
    else:
        assert isinstance(step, While)
        lines = [f"{indent}{outs} = while"]
    for name, sub in children(step):
        lines.append(f"{indent}  {name}:")
        lines += graph_lines(sub, indent + "    ")
    return lines


def schedule_text(s: Schedule) -> str:
    kernels = "\n".join(kernel_text(k) for k in s.kernels)
    return kernels + "\n" + "\n".join(graph_lines(s.main)) + "\n"
