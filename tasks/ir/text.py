"""The IR as readable text: what golden tests compare and what debug dumps show.

    buf3: f32[8, 32] = pointwise
      t0 = load buf2[i0, i1]
      t1 = tanh t0
      -> t1
Index expressions print inline (`i0*64 + i1`); other shared values are numbered once.
"""

from __future__ import annotations

import json

from tasks.ir.expr import Expr, Op, walk
from tasks.ir.nodes import (
    Buffer,
    Cond,
    Extern,
    Fallback,
    Graph,
    Node,
    Pointwise,
    Reduction,
    Scatter,
    View,
    While,
    children,
)

_INFIX = {Op.ADD: "+", Op.SUB: "-", Op.MUL: "*", Op.FLOORDIV: "//", Op.MOD: "%"}


def _leaf(e: Expr) -> str | None:
    if e.op is Op.VAR:
        return str(e.arg)
    if e.op is Op.CONST:
        return repr(e.arg) if e.dtype.value in ("i64", "f32", "b8") else f"{e.arg!r}:{e.dtype.value}"
    return None


def index_text(e: Expr, names: dict[str, str] | None = None) -> str:
    leaf = _leaf(e)
    if leaf is not None:
        return leaf
    if names and e.key in names:
        return names[e.key]
    if e.op in _INFIX:
        left, right = (index_text(a, names) for a in e.args)
        if e.op is not Op.ADD and " " in left and e.op is not Op.SUB:
            left = f"({left})"
        if e.op is not Op.ADD and (" " in right or _is_compound(e.args[1])):
            right = f"({right})"
        negative = e.args[1].op is Op.CONST and isinstance(e.args[1].arg, int) and e.args[1].arg < 0
        if e.op is Op.ADD and negative:
            return f"{left} - {-int(e.args[1].arg)}"  # type: ignore[arg-type]
        if e.op in (Op.ADD, Op.SUB):
            return f"{left} {_INFIX[e.op]} {right}"
        return f"{left}{_INFIX[e.op]}{right}"
    if e.op is Op.LOAD:
        return f"{e.arg}[{', '.join(index_text(a, names) for a in e.args)}]"
    return f"{e.op.value}({', '.join(index_text(a, names) for a in e.args)})"


def _is_compound(e: Expr) -> bool:
    return e.op in _INFIX and e.op is not Op.MUL


def _is_index(e: Expr) -> bool:
    return e.dtype.value == "i64" and e.op in (Op.VAR, Op.CONST, *_INFIX)


def expr_lines(roots: list[Expr]) -> tuple[list[str], list[str]]:
    """SSA lines for the value nodes below roots, and each root's name."""
    names: dict[str, str] = {}
    lines: list[str] = []
    for root in roots:
        for node in walk(root):
            if node.key in names or _leaf(node) is not None or _is_index(node):
                continue
            names[node.key] = f"t{len(lines)}"
            lines.append(f"{names[node.key]} = {_op_text(node, names)}")
    shown = [names.get(r.key) or index_text(r, names) for r in roots]
    return lines, shown


def _op_text(e: Expr, names: dict[str, str]) -> str:
    def ref(a: Expr) -> str:
        return names.get(a.key) or index_text(a, names)

    if e.op is Op.LOAD:
        return f"load {e.arg}[{', '.join(ref(a) for a in e.args)}]"
    if e.op is Op.CAST:
        return f"cast {ref(e.args[0])} -> {e.dtype.value}"
    return f"{e.op.value} {', '.join(ref(a) for a in e.args)}"


def expr_text(e: Expr) -> str:
    lines, shown = expr_lines([e])
    return "; ".join([*lines, f"-> {shown[0]}"])


def buffer_type(b: Buffer) -> str:
    return f"{b.dtype.value}[{', '.join(map(str, b.shape))}]"


def view_text(v: View | None) -> str:
    if v is None:
        return "none"
    return (f"{v.buffer}<{', '.join(map(str, v.shape))} : {', '.join(map(str, v.stride))}"
            f"{f' +{v.offset}' if v.offset else ''}>")


def node_text(node: Node, indent: str = "", label: str = "") -> list[str]:
    if isinstance(node, Pointwise):
        head = f"{node.out.name}: {buffer_type(node.out)} = pointwise"
        return _with_body(indent, label + head, [node.body])
    if isinstance(node, Reduction):
        outs = ", ".join(f"{b.name}: {buffer_type(b)}" for b in node.outs)
        head = f"{outs} = {node.op.value} over r{list(node.reduce_ranges)}"
        return _with_body(indent, label + head, [node.body])
    if isinstance(node, Scatter):
        head = f"{node.target}[...] {'+=' if node.accumulate else '='} scatter over {list(node.ranges)}"
        return _with_body(indent, label + head, [*node.index, node.value])
    if isinstance(node, Extern):
        args = ", ".join(view_text(v) for v in node.inputs)
        return [f"{indent}{node.out.name}: {buffer_type(node.out)} = extern {node.op.value}({args}) "
                f"{node.params}"]
    if isinstance(node, Fallback):
        outs = ", ".join(f"{b.name}: {buffer_type(b)}" for b in node.outs)
        args = ", ".join(view_text(v) for v in node.inputs)
        return [f"{indent}{outs} = fallback {node.target}({args}) {node.args}"]
    return _control_text(node, indent)


def _with_body(indent: str, head: str, roots: list[Expr]) -> list[str]:
    lines, shown = expr_lines(roots)
    return [f"{indent}{head}", *(f"{indent}  {line}" for line in lines),
            f"{indent}  -> {', '.join(shown)}"]


def _control_text(node: Cond[Graph] | While[Graph], indent: str) -> list[str]:
    outs = ", ".join(f"{b.name}: {buffer_type(b)}" for b in node.outs)
    if isinstance(node, Cond):
        args = ", ".join(view_text(v) for v in node.operands)
        lines = [f"{indent}{outs} = cond {view_text(node.pred)} ({args})"]
    else:
        carried = ", ".join(view_text(v) for v in node.carried)
        extra = ", ".join(view_text(v) for v in node.extra)
        lines = [f"{indent}{outs} = while ({carried}) extra ({extra})"]
    for name, sub in children(node):
        lines.append(f"{indent}  {name}:")
        lines += graph_lines(sub, indent + "    ")
    return lines


def graph_lines(g: Graph, indent: str = "") -> list[str]:
    lines = []
    for b in g.inputs:
        strides = f" stride {list(b.stride)}"
        weight = f" = weight {json.dumps(b.weight)}" if b.weight else ""
        lines.append(f"{indent}{b.kind.value} {b.name}: {buffer_type(b)}{strides}{weight}")
    for node in g.nodes:
        lines += node_text(node, indent)
    lines.append(f"{indent}return {', '.join(g.outputs)}")
    return lines


def graph_text(g: Graph) -> str:
    return "\n".join(graph_lines(g)) + "\n"
