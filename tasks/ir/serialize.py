"""Canonical JSON for the IR, and back.

Each node's expressions are written once as a table in post-order (children before parents,
shared subexpressions once) and referenced by position, so the file is as big as the DAG, not
as the tree. Floats are written exactly, as hex ({"float": "0x1.8p+1"}), which also gives
NaN and the infinities a JSON form.
"""

from __future__ import annotations

import json
from typing import Any

from cache.hashing import canonical_json
from tasks.ir.dtypes import DType
from tasks.ir.expr import Expr, Op, Scalar, walk
from tasks.ir.nodes import (
    Buffer,
    BufferKind,
    Cond,
    Extern,
    ExternOp,
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

Json = dict[str, Any]


class ExprTable:
    """Expressions of one node, numbered in post-order."""

    def __init__(self) -> None:
        self.rows: list[list[Any]] = []
        self.position: dict[str, int] = {}

    def add(self, root: Expr) -> int:
        for node in walk(root):
            if node.key not in self.position:
                args = [self.position[a.key] for a in node.args]
                self.position[node.key] = len(self.rows)
                self.rows.append([node.op.value, node.dtype.value, _arg_json(node.arg), args])
        return self.position[root.key]


def _arg_json(arg: str | Scalar | None) -> Any:
    return {"float": arg.hex()} if isinstance(arg, float) else arg


def _arg_from(value: Any) -> str | Scalar | None:
    if isinstance(value, dict):
        return float.fromhex(value["float"])
    return value  # type: ignore[no-any-return]


def read_exprs(rows: list[list[Any]]) -> list[Expr]:
    built: list[Expr] = []
    for op, dtype, arg, args in rows:
        built.append(Expr(Op(op), DType(dtype), tuple(built[i] for i in args), _arg_from(arg)))
    return built


def buffer_json(b: Buffer) -> Json:
    out: Json = {"name": b.name, "shape": list(b.shape), "stride": list(b.stride),
                 "dtype": b.dtype.value, "device": b.device, "kind": b.kind.value}
    if b.weight:
        out["weight"] = b.weight
    return out


def buffer_from(d: Json) -> Buffer:
    return Buffer(d["name"], tuple(d["shape"]), tuple(d["stride"]), DType(d["dtype"]), d["device"],
                  BufferKind(d["kind"]), d.get("weight", ""))


def view_json(v: View | None) -> Json | None:
    if v is None:
        return None
    return {"buffer": v.buffer, "shape": list(v.shape), "stride": list(v.stride),
            "offset": v.offset, "dtype": v.dtype.value}


def view_from(d: Json | None) -> View | None:
    if d is None:
        return None
    return View(d["buffer"], tuple(d["shape"]), tuple(d["stride"]), d["offset"], DType(d["dtype"]))


def _views_from(ds: list[Json]) -> tuple[View, ...]:
    views = [view_from(d) for d in ds]
    return tuple(v for v in views if v is not None)


def node_json(node: Node) -> Json:
    if isinstance(node, Pointwise | Reduction | Scatter):
        return _computed_json(node)
    base: Json = {"origin": node.origin}
    if isinstance(node, Extern):
        return base | {"kind": "extern", "op": node.op.value, "out": buffer_json(node.out),
                       "inputs": [view_json(v) for v in node.inputs], "params": json.loads(node.params)}
    if isinstance(node, Fallback):
        return base | {"kind": "fallback", "target": node.target,
                       "outs": [buffer_json(b) for b in node.outs],
                       "inputs": [view_json(v) for v in node.inputs], "args": json.loads(node.args)}
    if isinstance(node, Cond):
        return base | {"kind": "cond", "pred": view_json(node.pred),
                       "operands": [view_json(v) for v in node.operands],
                       "then": graph_json(node.then_graph), "else": graph_json(node.else_graph),
                       "outs": [buffer_json(b) for b in node.outs]}
    return base | {"kind": "while", "carried": [view_json(v) for v in node.carried],
                   "extra": [view_json(v) for v in node.extra],
                   "cond": graph_json(node.cond_graph), "body": graph_json(node.body_graph),
                   "outs": [buffer_json(b) for b in node.outs]}


def _computed_json(node: Pointwise | Reduction | Scatter) -> Json:
    table = ExprTable()
    if isinstance(node, Pointwise):
        body = table.add(node.body)
        return {"kind": "pointwise", "origin": node.origin, "out": buffer_json(node.out),
                "body": body, "exprs": table.rows}
    if isinstance(node, Reduction):
        body = table.add(node.body)
        return {"kind": "reduction", "origin": node.origin, "op": node.op.value,
                "outs": [buffer_json(b) for b in node.outs], "ranges": list(node.ranges),
                "reduce_ranges": list(node.reduce_ranges), "body": body, "exprs": table.rows}
    idx = [table.add(e) for e in node.index]
    value = table.add(node.value)
    return {"kind": "scatter", "origin": node.origin, "target": node.target,
            "ranges": list(node.ranges), "index": idx, "value": value,
            "accumulate": node.accumulate, "exprs": table.rows}


def node_from(d: Json) -> Node:
    kind, origin = d["kind"], d["origin"]
    if kind in ("pointwise", "reduction", "scatter"):
        exprs = read_exprs(d["exprs"])
        if kind == "pointwise":
            return Pointwise(buffer_from(d["out"]), exprs[d["body"]], origin)
        if kind == "reduction":
            return Reduction(tuple(buffer_from(b) for b in d["outs"]), ReduceOp(d["op"]),
                             tuple(d["ranges"]), tuple(d["reduce_ranges"]), exprs[d["body"]], origin)
        return Scatter(d["target"], tuple(d["ranges"]), tuple(exprs[i] for i in d["index"]),
                       exprs[d["value"]], d["accumulate"], origin)
    outs = tuple(buffer_from(b) for b in d.get("outs", []))
    if kind == "extern":
        return Extern(ExternOp(d["op"]), buffer_from(d["out"]),
                      tuple(view_from(v) for v in d["inputs"]), _canon(d["params"]), origin)
    if kind == "fallback":
        return Fallback(d["target"], outs, _views_from(d["inputs"]), _canon(d["args"]), origin)
    if kind == "cond":
        pred = view_from(d["pred"])
        assert pred is not None
        return Cond(pred, _views_from(d["operands"]), graph_from(d["then"]), graph_from(d["else"]),
                    outs, origin)
    if kind == "while":
        return While(_views_from(d["carried"]), _views_from(d["extra"]), graph_from(d["cond"]),
                     graph_from(d["body"]), outs, origin)
    raise ValueError(f"unknown node kind {kind!r}")


def _canon(value: Any) -> str:
    return canonical_json(value).decode()


def graph_json(g: Graph) -> Json:
    return {"inputs": [buffer_json(b) for b in g.inputs], "nodes": [node_json(n) for n in g.nodes],
            "outputs": list(g.outputs)} | ({"writes": list(g.writes)} if g.writes else {})


def graph_from(d: Json) -> Graph:
    return Graph(tuple(buffer_from(b) for b in d["inputs"]), tuple(node_from(n) for n in d["nodes"]),
                 tuple(d["outputs"]), tuple(d.get("writes", ())))


def dumps(g: Graph) -> bytes:
    return canonical_json(graph_json(g))


def loads(data: bytes | str) -> Graph:
    return graph_from(json.loads(data))
