"""The loop structure inside a kernel: which nodes run in which pass over R.

A reduction kernel is a sequence of stages. A loop stage is one pass over R for each row of X:
it evaluates its full (X x R) nodes and accumulates its reductions. A row stage evaluates row
(X) nodes once per row, between passes. A reduction whose body needs another reduction's
result (softmax's sum needs the max) runs one pass later. A full value lives only within a
pass: a later pass that needs it lists its node again, and computes it again (a stored output
is stored by the first pass that lists it; a later one needs only its value).

    softmax:  loop [max] -> loop [sum of exp(x - max)] -> loop [out = exp(x - max) / sum]

A pointwise kernel is a single row stage. Code generators read the stages instead of working
them out: a persistent kernel keeps R in registers and runs the passes back to back, a looped
one runs each pass as a loop over R in chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

from tasks.ir.expr import buffers_read
from tasks.ir.nodes import Pointwise, Reduction, Scatter

KernelNode = Pointwise | Reduction | Scatter


@dataclass(frozen=True, slots=True)
class KernelStage:
    loop: bool  # a pass over R (full nodes, reductions), or a row stage (X only)
    nodes: tuple[int, ...]  # indices into the kernel's nodes, in evaluation order


def _reads(node: KernelNode) -> list[str]:
    if isinstance(node, Scatter):
        return [b for e in (*node.index, node.value) for b in buffers_read(e)]
    return buffers_read(node.body)


def _writes(node: KernelNode) -> list[str]:
    if isinstance(node, Scatter):
        return []
    return [b.name for b in (node.outs if isinstance(node, Reduction) else (node.out,))]


def plan_stages(nodes: tuple[KernelNode, ...], ranges: tuple[int, ...],
                reduce_ranges: tuple[int, ...]) -> tuple[KernelStage, ...]:
    if not reduce_ranges:
        return (KernelStage(False, tuple(range(len(nodes)))),)
    producer = {b: i for i, node in enumerate(nodes) for b in _writes(node)}
    is_row = [isinstance(n, Pointwise) and n.out.shape == ranges for n in nodes]
    when = _passes(nodes, producer)
    last = max((w for i, w in enumerate(when) if not is_row[i]), default=0)
    stages: list[KernelStage] = []
    for p in range(last + 2):
        rows = tuple(i for i in range(len(nodes)) if is_row[i] and when[i] == p)
        if rows:
            stages.append(KernelStage(False, rows))
        if p <= last:
            in_pass = _with_recomputed(nodes, producer, is_row, when, p)
            if in_pass:
                stages.append(KernelStage(True, in_pass))
    return tuple(stages)


def _passes(nodes: tuple[KernelNode, ...], producer: dict[str, int]) -> list[int]:
    """Per node: its pass (full nodes, reductions), or for a row node the pass before which it runs."""
    when: list[int] = []
    for i, node in enumerate(nodes):
        p = 0
        for b in _reads(node):
            j = producer.get(b)
            if j is None or j >= i:
                continue
            # A reduction's result is ready after its pass; a row value before pass p, and a
            # full value within it.
            ready = when[j] + 1 if isinstance(nodes[j], Reduction) else when[j]
            p = max(p, ready)
        when.append(p)
    return when


def _with_recomputed(nodes: tuple[KernelNode, ...], producer: dict[str, int], is_row: list[bool],
                     when: list[int], p: int) -> tuple[int, ...]:
    """The nodes of pass p, and the full nodes of earlier passes they read (computed again)."""
    chosen = {i for i in range(len(nodes)) if not is_row[i] and when[i] == p}
    stack = list(chosen)
    while stack:
        for b in _reads(nodes[stack.pop()]):
            j = producer.get(b)
            if j is not None and j not in chosen and not is_row[j] and not isinstance(nodes[j], Reduction):
                chosen.add(j)
                stack.append(j)
    return tuple(sorted(chosen))
