"""The first scheduling passes, IR -> IR: drop dead nodes, inline pointwise nodes into consumers.

Inlining replaces a load of a pointwise node's buffer by the node's body at the load's index,
so a chain of pointwise ops, a transpose and the elementwise work around a reduction all end
up in the bodies of the nodes that must be materialized. Each refusal is written down.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

from tasks.codegen.ssa import orderable
from tasks.ir import index as ix
from tasks.ir.expr import Expr, Op, buffers_read, loads, rewrite, substitute, walk
from tasks.ir.nodes import (
    Fallback,
    Graph,
    Node,
    Pointwise,
    Reduction,
    Scatter,
    node_inputs,
    node_writes,
)

# Note: a producer read at several sites is recomputed at each. Up to this many body ops in
# total we recompute (cheap arithmetic beats a round trip through memory); beyond it we store.
RECOMPUTE_BUDGET = 48
# Note: nor do we recompute a producer that reads more than this many buffers at more than one
# site. A residual stream (x = x + f(x), layer after layer) would otherwise never be stored:
# each layer's kernels would reread every earlier layer's outputs (Inductor's
# realize_reads_threshold is the same idea).
READS_BUDGET = 4


@dataclass
class Decisions:
    """What a pass refused, and why: written to the debug dump."""

    refused: list[str] = field(default_factory=list)

    def refuse(self, what: str, why: str) -> None:
        self.refused.append(f"{what}: {why}")


def eliminate_dead(graph: Graph) -> Graph:
    live = set(graph.outputs)
    kept: list[Node] = []
    for node in reversed(graph.nodes):
        writes = node_writes(node)
        # Note: a fallback with no outputs runs for its effect (an error check), so it stays.
        if isinstance(node, Scatter) or (isinstance(node, Fallback) and not node.outs) or \
                any(w in live for w in writes):
            live.update(node_inputs(node))
            kept.append(node)
    return replace(graph, nodes=tuple(reversed(kept)))


def read_sites(graph: Graph) -> dict[str, list[Node]]:
    """buffer -> one entry per load site (a node reading a buffer twice appears twice)."""
    sites: dict[str, list[Node]] = defaultdict(list)
    for node in graph.nodes:
        if isinstance(node, Pointwise | Reduction):
            for e in loads(node.body):
                sites[str(e.arg)].append(node)
        elif isinstance(node, Scatter):
            for root in (*node.index, node.value):
                for e in loads(root):
                    sites[str(e.arg)].append(node)
        else:
            for name in node_inputs(node):
                sites[name].append(node)
    return sites


def body_ops(e: Expr) -> int:
    return sum(1 for n in walk(e) if n.op not in (Op.VAR, Op.CONST) and n.dtype.value != "i64")


def inline_refusal(node: Pointwise, graph: Graph, sites: list[Node], mutated: set[str]) -> str | None:
    """Why this pointwise node must keep its buffer, or None to inline it."""
    name = node.out.name
    if name in graph.outputs:
        return "a graph output"
    if name in mutated:
        return "a scatter writes into it"
    computed = Pointwise | Reduction | Scatter
    calls = sorted({type(s).__name__.lower() for s in sites if not isinstance(s, computed)})
    if calls:
        return f"read by a call ({', '.join(calls)}) that needs it in memory"
    reads = len(buffers_read(node.body))
    if len(sites) > 1 and reads > READS_BUDGET:
        return f"read at {len(sites)} sites, and it reads {reads} buffers (more than {READS_BUDGET})"
    cost = body_ops(node.body) * len(sites)
    if len(sites) > 1 and cost > RECOMPUTE_BUDGET:
        return (f"read at {len(sites)} sites; recomputing its {body_ops(node.body)} ops at each "
                f"exceeds the budget of {RECOMPUTE_BUDGET}")
    return None


def inline_pointwise(graph: Graph, decisions: Decisions) -> Graph:
    apart: set[str] = set()
    while True:
        tried = Decisions()
        inlined, knotted = _inlined(graph, tried, apart)
        if knotted <= apart:
            decisions.refused += tried.refused
            return inlined
        apart |= knotted


# Note: inlining a producer whose body holds masked loads (a cat's parts, a pad) into a
# consumer that computes a mask from the same loads can knot the consumer's masks: a load read
# to compute a mask, and under that mask too, which the expression writers cannot order
# (tasks/codegen/ssa.py; BEiT's relative position bias, a cat indexed by a table built in the
# graph, made one). Such producers are kept apart, in buffers of their own, and inlining is
# redone; each round keeps more apart, so it ends.
def _inlined(graph: Graph, decisions: Decisions, apart: set[str]) -> tuple[Graph, set[str]]:
    """The graph with pointwise nodes inlined, except those `apart`; and the masked producers
    whose inlining left a consumer's masks knotted."""
    sites = read_sites(graph)
    mutated = {n.target for n in graph.nodes if isinstance(n, Scatter)}
    bodies: dict[str, Pointwise] = {}
    kept: list[Node] = []
    knotted: set[str] = set()
    masked: set[str] = set()  # the inlined bodies with masked loads
    for before in graph.nodes:
        node = _named_after_copied(expand_loads(before, bodies), before, bodies)
        inlined = {name for root in _roots(before) for name in buffers_read(root) if name in masked}
        if inlined and not orderable(_roots(node)):
            knotted |= inlined
        if isinstance(node, Pointwise):
            why = inline_refusal(node, graph, sites.get(node.out.name, []), mutated)
            if why is None and node.out.name in apart:
                why = "its masked loads would knot a consumer's masks"
            if why is None:
                bodies[node.out.name] = node
                if any(n.op is Op.MASKED for n in walk(node.body)):
                    masked.add(node.out.name)
                continue
            decisions.refuse(f"inline {node.out.name} ({node.origin})", why)
        kept.append(node)
    return replace(graph, nodes=tuple(kept)), knotted


def _roots(node: Node) -> list[Expr]:
    """The expressions a node's kernel computes."""
    if isinstance(node, Pointwise | Reduction):
        return [node.body]
    if isinstance(node, Scatter):
        return [*node.index, node.value]
    return []


def _named_after_copied(node: Node, before: Node, bodies: dict[str, Pointwise]) -> Node:
    """A copy (a view a call needs in memory) that an inlined producer's work now fills is
    named after that producer: `gelu`, not the `addmm` that needed the copy."""
    if isinstance(node, Pointwise) and isinstance(before, Pointwise) and before.body.op is Op.LOAD:
        producer = bodies.get(str(before.body.arg))
        if producer is not None and producer.origin:
            return replace(node, origin=producer.origin)
    return node


def expand_loads(node: Node, bodies: dict[str, Pointwise]) -> Node:
    if not bodies:
        return node
    if isinstance(node, Pointwise):
        return replace(node, body=expand(node.body, bodies, _ranges(node.out.shape, ())))
    if isinstance(node, Reduction):
        return replace(node, body=expand(node.body, bodies, _ranges(node.ranges, node.reduce_ranges)))
    if isinstance(node, Scatter):
        r = _ranges(node.ranges, ())
        return replace(node, index=tuple(expand(e, bodies, r) for e in node.index),
                       value=expand(node.value, bodies, r))
    return node


def _ranges(shape: tuple[int, ...], reduce: tuple[int, ...]) -> dict[str, int]:
    out = {f"i{k}": s for k, s in enumerate(shape)}
    out.update({f"r{k}": s for k, s in enumerate(reduce)})
    return out


def expand(root: Expr, bodies: dict[str, Pointwise], ranges: ix.Ranges) -> Expr:
    """Loads of inlined buffers replaced by the producers' bodies at the loads' indices."""
    def step(e: Expr, children: tuple[Expr, ...]) -> Expr | None:
        if e.op is not Op.LOAD or str(e.arg) not in bodies:
            return None
        producer = bodies[str(e.arg)]
        values = {f"i{k}": idx for k, idx in enumerate(children)}
        return simplify_indices(substitute(producer.body, values), ranges)

    # Note: casts stay as they are, fp16/bf16 roundings between fused ops included, so a fused
    # kernel rounds exactly where eager does (Inductor drops them; we choose eager's numbers).
    return rewrite(root, step)


def simplify_indices(root: Expr, ranges: ix.Ranges) -> Expr:
    def step(e: Expr, children: tuple[Expr, ...]) -> Expr | None:
        if e.op is Op.LOAD:
            return Expr(Op.LOAD, e.dtype, tuple(ix.simplify(c, ranges) for c in children), e.arg)
        return None

    return rewrite(root, step)
