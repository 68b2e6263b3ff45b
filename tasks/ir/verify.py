"""The IR's checker: every rule a well-formed graph keeps. Tests run it at every stage boundary.

`verify(graph)` raises `IRError` naming the node and the broken rule.
"""

from __future__ import annotations

from tasks.ir.dtypes import DType
from tasks.ir.expr import (
    ARITY,
    BINARY,
    BOOL_RESULT,
    COMPARE,
    FLOAT_ONLY,
    INT_ONLY,
    UNARY,
    Expr,
    Op,
    walk,
)
from tasks.ir.nodes import (
    Buffer,
    Cond,
    Extern,
    Fallback,
    Graph,
    Node,
    Pointwise,
    ReduceOp,
    Reduction,
    Scatter,
    View,
    While,
)


class IRError(ValueError):
    pass


def verify(graph: Graph, where: str = "graph") -> None:
    known: dict[str, Buffer] = {}
    for b in graph.inputs:
        _check_buffer(b, known, where)
    for node in graph.nodes:
        _check_node(node, known, f"{where}/{getattr(node, 'origin', '') or type(node).__name__}")
    for name in graph.outputs:
        if name not in known:
            raise IRError(f"{where}: output {name!r} is not a buffer of the graph")


def _check_buffer(b: Buffer, known: dict[str, Buffer], where: str) -> None:
    if b.name in known:
        raise IRError(f"{where}: buffer {b.name!r} defined twice")
    if len(b.stride) != len(b.shape) or any(s < 0 for s in b.shape):
        raise IRError(f"{where}: buffer {b.name!r} has shape {b.shape} and stride {b.stride}")
    known[b.name] = b


def _check_node(node: Node, known: dict[str, Buffer], where: str) -> None:
    if isinstance(node, Pointwise):
        check_expr(node.body, known, _loop_vars(len(node.out.shape), 0), where)
        _same(node.body.dtype, node.out.dtype, where, "body and output dtypes")
    elif isinstance(node, Reduction):
        _check_reduction(node, known, where)
    elif isinstance(node, Scatter):
        _check_scatter(node, known, where)
    elif isinstance(node, Extern | Fallback):
        for v in node.inputs:
            if v is not None:
                _check_view(v, known, where)
    elif isinstance(node, Cond):
        _check_cond(node, known, where)
    else:
        _check_while(node, known, where)
    for b in node.outs:
        _check_buffer(b, known, where)


def _check_reduction(node: Reduction, known: dict[str, Buffer], where: str) -> None:
    check_expr(node.body, known, _loop_vars(len(node.ranges), len(node.reduce_ranges)), where)
    want = 2 if node.op is ReduceOp.WELFORD else 1
    if len(node.outs) != want:
        raise IRError(f"{where}: {node.op.value} has {len(node.outs)} outputs, wants {want}")
    for b in node.outs:
        if b.shape != node.ranges:
            raise IRError(f"{where}: reduction output {b.name} shape {b.shape} != ranges {node.ranges}")
    out_dtype = {ReduceOp.ARGMAX: DType.I64, ReduceOp.ARGMIN: DType.I64, ReduceOp.ANY: DType.BOOL,
                 ReduceOp.ALL: DType.BOOL}.get(node.op, node.body.dtype)
    for b in node.outs:
        _same(b.dtype, out_dtype, where, f"{node.op.value} output dtype")
    if node.op is ReduceOp.WELFORD and not node.body.dtype.is_float:
        raise IRError(f"{where}: welford over {node.body.dtype.value}")
    if node.op in (ReduceOp.ANY, ReduceOp.ALL):
        _same(node.body.dtype, DType.BOOL, where, f"{node.op.value} body dtype")


def _check_scatter(node: Scatter, known: dict[str, Buffer], where: str) -> None:
    target = known.get(node.target)
    if target is None:
        raise IRError(f"{where}: scatter into unknown buffer {node.target!r}")
    if len(node.index) != len(target.shape):
        raise IRError(f"{where}: scatter index has {len(node.index)} dims, target {len(target.shape)}")
    scope = _loop_vars(len(node.ranges), 0)
    for e in node.index:
        check_expr(e, known, scope, where)
        _same(e.dtype, DType.I64, where, "scatter index dtype")
    check_expr(node.value, known, scope, where)
    _same(node.value.dtype, target.dtype, where, "scatter value dtype")


def _check_view(v: View, known: dict[str, Buffer], where: str) -> None:
    base = known.get(v.buffer)
    if base is None:
        raise IRError(f"{where}: view of unknown buffer {v.buffer!r}")
    _same(v.dtype, base.dtype, where, f"view of {v.buffer} dtype")
    if len(v.shape) != len(v.stride) or any(s < 0 for s in v.stride):
        raise IRError(f"{where}: view of {v.buffer} has shape {v.shape}, stride {v.stride}")
    if any(n == 0 for n in v.shape):
        return
    last = v.offset + sum((n - 1) * s for n, s in zip(v.shape, v.stride, strict=True))
    if v.offset < 0 or last * v.dtype.itemsize >= max(base.nbytes, 1):
        raise IRError(f"{where}: view of {v.buffer} reaches outside it")


def _check_cond(node: Cond[Graph], known: dict[str, Buffer], where: str) -> None:
    for v in (node.pred, *node.operands):
        _check_view(v, known, where)
    for name, sub in (("then", node.then_graph), ("else", node.else_graph)):
        _check_subgraph(sub, node.operands, node.outs, f"{where}.{name}")


def _check_while(node: While[Graph], known: dict[str, Buffer], where: str) -> None:
    operands = (*node.carried, *node.extra)
    for v in operands:
        _check_view(v, known, where)
    _check_subgraph(node.body_graph, operands, node.outs, f"{where}.body")
    verify(node.cond_graph, f"{where}.cond")
    if len(node.cond_graph.inputs) != len(operands) or len(node.cond_graph.outputs) != 1:
        raise IRError(f"{where}.cond: takes {len(node.cond_graph.inputs)} inputs, "
                      f"{len(node.cond_graph.outputs)} outputs")


def _check_subgraph(sub: Graph, operands: tuple[View, ...], outs: tuple[Buffer, ...], where: str) -> None:
    verify(sub, where)
    if len(sub.inputs) != len(operands):
        raise IRError(f"{where}: takes {len(sub.inputs)} inputs, given {len(operands)}")
    produced = sub.buffers()
    if len(sub.outputs) < len(outs):
        raise IRError(f"{where}: returns {len(sub.outputs)} values, {len(outs)} expected")
    for name, out in zip(sub.outputs, outs, strict=False):
        b = produced[name]
        if (b.shape, b.dtype) != (out.shape, out.dtype):
            raise IRError(f"{where}: output {name} is {b.dtype.value}{list(b.shape)}, "
                          f"expected {out.dtype.value}{list(out.shape)}")


def _loop_vars(n: int, m: int) -> set[str]:
    return {f"i{k}" for k in range(n)} | {f"r{k}" for k in range(m)}


def _same(a: DType, b: DType, where: str, what: str) -> None:
    if a is not b:
        raise IRError(f"{where}: {what} differ ({a.value} vs {b.value})")


def check_expr(root: Expr, known: dict[str, Buffer], scope: set[str], where: str) -> None:
    for e in walk(root):
        _check_one(e, known, scope, where)


def _check_one(e: Expr, known: dict[str, Buffer], scope: set[str], where: str) -> None:
    if e.op in ARITY and len(e.args) != ARITY[e.op]:
        raise IRError(f"{where}: {e.op.value} takes {ARITY[e.op]} operands, has {len(e.args)}")
    if e.op is Op.VAR and e.arg not in scope:
        raise IRError(f"{where}: loop variable {e.arg!r} is not in scope {sorted(scope)}")
    if e.op is Op.LOAD:
        b = known.get(str(e.arg))
        if b is None:
            raise IRError(f"{where}: load of unknown buffer {e.arg!r}")
        if len(e.args) != len(b.shape) or e.dtype is not b.dtype:
            raise IRError(f"{where}: load {e.arg}: {len(e.args)} indices as {e.dtype.value}, "
                          f"buffer is {b.dtype.value}{list(b.shape)}")
        for a in e.args:
            _same(a.dtype, DType.I64, where, "index dtype and i64")
    elif e.op in BINARY | COMPARE:
        _same(e.args[0].dtype, e.args[1].dtype, where, f"{e.op.value} operand dtypes")
    elif e.op in (Op.WHERE, Op.MASKED):
        _same(e.args[0].dtype, DType.BOOL, where, f"{e.op.value} condition dtype and bool")
        _same(e.args[1].dtype, e.args[2].dtype, where, f"{e.op.value} branch dtypes")
    _check_result_dtype(e, where)


def _check_result_dtype(e: Expr, where: str) -> None:
    if e.op in BOOL_RESULT:
        _same(e.dtype, DType.BOOL, where, f"{e.op.value} result dtype and bool")
    elif e.op in UNARY | BINARY:
        _same(e.dtype, e.args[0].dtype, where, f"{e.op.value} result and operand dtypes")
    operand = e.args[0].dtype if e.args else e.dtype
    if e.op in FLOAT_ONLY and not operand.is_float:
        raise IRError(f"{where}: {e.op.value} on {operand.value} (floating point only)")
    if e.op in INT_ONLY and operand.is_float:
        raise IRError(f"{where}: {e.op.value} on {operand.value} (integers and bool only)")
