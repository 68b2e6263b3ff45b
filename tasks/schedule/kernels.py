"""A fused unit as a self-contained kernel: graph buffers renamed to parameters and locals.

Inputs become in0.. in the order they are first read, stored outputs out0.., values that
never leave the kernel tmp0... In a reduction kernel a full node's loop variables past X are
renamed r0.., so every node of a kernel speaks of the same X and R.
"""

from __future__ import annotations

from dataclasses import replace

from tasks.ir.expr import Expr, Op, rewrite, var
from tasks.ir.nodes import Buffer, Pointwise, Reduction, Scatter
from tasks.schedule.fuse import Unit
from tasks.schedule.kernel_loops import plan_stages
from tasks.schedule.model import Kernel, KernelNode, Param


class Names:
    def __init__(self) -> None:
        self.map: dict[str, str] = {}
        self.counts = {"in": 0, "out": 0, "tmp": 0}

    def give(self, buffer: str, kind: str) -> str:
        if buffer not in self.map:
            self.map[buffer] = f"{kind}{self.counts[kind]}"
            self.counts[kind] += 1
        return self.map[buffer]


def rename(root: Expr, names: dict[str, str], var_map: dict[str, str]) -> Expr:
    def step(e: Expr, children: tuple[Expr, ...]) -> Expr | None:
        if e.op is Op.LOAD:
            return Expr(Op.LOAD, e.dtype, children, names[str(e.arg)])
        if e.op is Op.VAR and str(e.arg) in var_map:
            return var(var_map[str(e.arg)])
        return None

    return rewrite(root, step)


def _full_vars(unit: Unit, node: KernelNode) -> dict[str, str]:
    if not isinstance(node, Pointwise) or not unit.reduce or node.out.shape == unit.ranges:
        return {}
    n = len(unit.ranges)
    return {f"i{n + k}": f"r{k}" for k in range(len(unit.reduce))}


def param_spec(b: Buffer, name: str) -> Buffer:
    """The buffer as a kernel sees it: layout and dtype only, so a kernel reading layer 3's
    weights has the same key as the one reading layer 4's."""
    return Buffer(name, b.shape, b.stride, b.dtype, b.device)


def make_kernel(unit: Unit, name: str, stored: set[str], buffers: dict[str, Buffer]) -> Kernel:
    names = Names()
    nodes: list[KernelNode] = []
    params: list[Param] = []
    local: list[Buffer] = []
    for node in unit.nodes:
        assert isinstance(node, Pointwise | Reduction | Scatter)
        for buf in _reads(node):
            if buf not in unit.writes and buf not in names.map:
                spec = buffers[buf]
                params.append(Param(names.give(buf, "in"), buf, "in", param_spec(spec, names.map[buf])))
        if isinstance(node, Scatter):
            target = buffers[node.target]
            params.append(Param(names.give(node.target, "out"), node.target, "inout",
                                param_spec(target, names.map[node.target])))
        for b in (node.outs if not isinstance(node, Scatter) else ()):
            kind = "out" if b.name in stored else "tmp"
            renamed = replace(b, name=names.give(b.name, kind))
            if kind == "out":
                params.append(Param(renamed.name, b.name, "out", renamed))
            else:
                local.append(renamed)
        nodes.append(_renamed(node, names.map, _full_vars(unit, node)))
    origins = tuple(dict.fromkeys(n.origin for n in unit.nodes if hasattr(n, "origin")))
    ranges = unit.ranges
    if len(unit.nodes) == 1 and isinstance(unit.nodes[0], Scatter):
        ranges = unit.nodes[0].ranges
    stages = plan_stages(tuple(nodes), ranges, unit.reduce)
    return Kernel(name, origins, ranges, unit.reduce, tuple(params), tuple(local), tuple(nodes), stages)


def _reads(node: KernelNode) -> list[str]:
    from tasks.ir.expr import buffers_read

    if isinstance(node, Scatter):
        found: list[str] = []
        for e in (*node.index, node.value):
            found += buffers_read(e)
        return list(dict.fromkeys(found))
    return buffers_read(node.body)


def _renamed(node: KernelNode, names: dict[str, str], var_map: dict[str, str]) -> KernelNode:
    if isinstance(node, Pointwise):
        return Pointwise(replace(node.out, name=names[node.out.name]), rename(node.body, names, var_map),
                         node.origin)
    if isinstance(node, Reduction):
        outs = tuple(replace(b, name=names[b.name]) for b in node.outs)
        return replace(node, outs=outs, body=rename(node.body, names, var_map))
    return Scatter(names[node.target], node.ranges, tuple(rename(e, names, var_map) for e in node.index),
                   rename(node.value, names, var_map), node.accumulate, node.origin)
