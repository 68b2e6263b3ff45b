"""Fusion: the nodes left after inlining, grouped into kernels, and the launch order.

A kernel iterates a domain X (the outer, parallel loops) and optionally R (a reduction). Its
nodes are reductions over X x R, "row" pointwise nodes over X and "full" pointwise nodes over
X ++ R (prologues and epilogues). A node joins a kernel when the domains agree, when every
value it reads from the kernel is read exactly where the kernel computes it (so it can stay in
registers), and when joining creates no cycle through a node outside the kernel. Extern calls,
fallbacks, scatters and control flow are never fused with anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tasks.ir import index as ix
from tasks.ir.expr import Expr, loads, var
from tasks.ir.nodes import Node, Pointwise, Reduction, node_inputs, node_writes
from tasks.ir.text import index_text
from tasks.schedule.inline import Decisions

Fusible = Pointwise | Reduction
_SIBLING_WINDOW = 8  # how many recent kernels a node with no producer among them may join


@dataclass
class Unit:
    """One step of the launch order: a kernel being grown, or a single unfusible node."""

    id: int
    nodes: list[Node]
    ranges: tuple[int, ...] = ()
    reduce: tuple[int, ...] = ()
    kernel: bool = False
    deps: set[int] = field(default_factory=set)
    reads: set[str] = field(default_factory=set)
    writes: dict[str, Node] = field(default_factory=dict)

    def label(self) -> str:
        origins = ",".join(dict.fromkeys(getattr(n, "origin", "") for n in self.nodes))
        return f"unit{self.id}({origins})"


def domain_of(node: Fusible) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if isinstance(node, Reduction):
        return node.ranges, node.reduce_ranges
    return node.out.shape, ()


class Fuser:
    def __init__(self, decisions: Decisions) -> None:
        self.units: list[Unit] = []
        self.producer: dict[str, int] = {}
        self.decisions = decisions

    def add(self, node: Node) -> None:
        deps = {self.producer[b] for b in node_inputs(node) if b in self.producer}
        if isinstance(node, Pointwise | Reduction):
            for d in sorted(deps):
                if not self.units[d].kernel:
                    kind = type(self.units[d].nodes[0]).__name__.lower()
                    self.decisions.refuse(f"fuse {_name(node)} into {self.units[d].label()}",
                                          f"it is a call ({kind}), and calls are never fused")
            for unit in self._candidates(node, deps):
                why = self.why_not(unit, node, deps)
                if why is None:
                    self._join(unit, node, deps)
                    return
                self.decisions.refuse(f"fuse {_name(node)} into {unit.label()}", why)
        unit = Unit(len(self.units), [], kernel=isinstance(node, Pointwise | Reduction))
        if isinstance(node, Pointwise | Reduction):
            unit.ranges, unit.reduce = domain_of(node)
        self.units.append(unit)
        self._join(unit, node, deps)

    def _candidates(self, node: Fusible, deps: set[int]) -> list[Unit]:
        producers = [self.units[d] for d in sorted(deps, reverse=True) if self.units[d].kernel]
        reads = set(node_inputs(node))
        recent = [u for u in reversed(self.units[-_SIBLING_WINDOW:])
                  if u.kernel and u.id not in deps and u.reads & reads]
        return producers + recent

    def _join(self, unit: Unit, node: Node, deps: set[int]) -> None:
        if unit.kernel and isinstance(node, Reduction) and not unit.reduce:
            unit.ranges, unit.reduce = node.ranges, node.reduce_ranges
        unit.nodes.append(node)
        unit.deps |= deps - {unit.id}
        unit.reads.update(node_inputs(node))
        for name in node_writes(node):
            unit.writes[name] = node
            self.producer[name] = unit.id

    def why_not(self, unit: Unit, node: Fusible, deps: set[int]) -> str | None:
        return (self._domain_mismatch(unit, node) or self._misplaced_read(unit, node)
                or self._cycle(unit, deps))

    def _domain_mismatch(self, unit: Unit, node: Fusible) -> str | None:
        x, r = domain_of(node)
        if isinstance(node, Reduction):
            if unit.reduce:
                ok = (x, r) == (unit.ranges, unit.reduce)
            else:
                ok = x == unit.ranges or x + r == unit.ranges
        else:
            ok = x in (unit.ranges, unit.ranges + unit.reduce)
        if ok:
            return None
        return (f"iteration domains differ: kernel {_dom(unit.ranges, unit.reduce)}, "
                f"node {_dom(x, r)}")

    def _misplaced_read(self, unit: Unit, node: Fusible) -> str | None:
        x, r = unit.ranges, unit.reduce
        if isinstance(node, Reduction) and not r:
            x, r = node.ranges, node.reduce_ranges
        for load in loads(node.body):
            producer = unit.writes.get(str(load.arg))
            if producer is None:
                continue
            ranges = {f"i{k}": size for k, size in enumerate(x + (r if isinstance(node, Pointwise) else ()))}
            ranges.update({f"r{k}": size for k, size in enumerate(r)})
            want = tuple(ix.simplify(e, ranges) for e in expected_index(producer, node, x, r))
            if load.args != want:
                shown = ", ".join(index_text(a) for a in load.args)
                return f"reads {load.arg} at [{shown}], not where the kernel computes it"
        return None

    def _cycle(self, unit: Unit, deps: set[int]) -> str | None:
        for d in deps - {unit.id}:
            path = self._path(d, unit.id)
            if path:
                return f"it would need {self.units[path[0]].label()} to run both before and after the kernel"
        return None

    def _path(self, start: int, target: int) -> list[int]:
        """A chain of units from start down to target through deps (empty if none)."""
        stack, seen = [(start, [start])], {start}
        while stack:
            current, trail = stack.pop()
            for d in self.units[current].deps:
                if d == target:
                    return trail
                if d not in seen:
                    seen.add(d)
                    stack.append((d, [*trail, d]))
        return []

    def order(self) -> list[Unit]:
        """Units in a launch order that respects every dependency, program order otherwise."""
        done: set[int] = set()
        out: list[Unit] = []
        pending = list(self.units)
        while pending:
            for i, unit in enumerate(pending):
                if unit.deps <= done:
                    out.append(pending.pop(i))
                    done.add(unit.id)
                    break
            else:
                raise AssertionError("fusion made a cycle")
        return out


def expected_index(producer: Node, consumer: Fusible, x: tuple[int, ...],
                   r: tuple[int, ...]) -> tuple[Expr, ...]:
    """Where a consumer in the same kernel must read a producer's buffer to find it in registers:
    a reduction's output or a row node's at the row index, a full node's at the full index."""
    row = tuple(var(f"i{k}") for k in range(len(x)))
    if isinstance(producer, Reduction) or (isinstance(producer, Pointwise) and producer.out.shape == x):
        return row
    if isinstance(consumer, Reduction):
        return row + tuple(var(f"r{k}") for k in range(len(r)))
    return tuple(var(f"i{k}") for k in range(len(x) + len(r)))


def _dom(x: tuple[int, ...], r: tuple[int, ...]) -> str:
    return f"{list(x)}" + (f" x r{list(r)}" if r else "")


def _name(node: Fusible) -> str:
    outs = node.outs if isinstance(node, Reduction) else (node.out,)
    return f"{','.join(b.name for b in outs)} ({node.origin})"


def fuse(nodes: tuple[Node, ...], decisions: Decisions) -> list[Unit]:
    fuser = Fuser(decisions)
    for node in nodes:
        fuser.add(node)
    return fuser.order()

