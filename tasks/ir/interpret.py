"""The IR interpreter: evaluates a graph on CPU with torch ops, the oracle for lower and schedule.

It shares no code with any code generator. A node's body is evaluated over its whole domain at
once: each loop variable is an `arange` shaped to broadcast along its own axis, a load is
advanced indexing with the index tensors, and a reduction reduces the trailing (r) axes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import torch

from tasks.ir.dtypes import TORCH_NAMES, DType
from tasks.ir.expr import Expr, Op
from tasks.ir.nodes import (
    Buffer,
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

Env = dict[str, torch.Tensor]
Alloc = Callable[[Buffer], torch.Tensor]


def torch_dtype(dtype: DType) -> torch.dtype:
    result: torch.dtype = getattr(torch, TORCH_NAMES[dtype])
    return result


def empty(b: Buffer) -> torch.Tensor:
    return torch.empty_strided(b.shape, b.stride, dtype=torch_dtype(b.dtype))


def run_graph(graph: Graph, args: Mapping[str, torch.Tensor], alloc: Alloc = empty) -> list[torch.Tensor]:
    """Run graph on its inputs (user inputs and weights, by buffer name); returns its outputs."""
    env: Env = {}
    for b in graph.inputs:
        if b.name not in args:
            raise KeyError(f"no value for graph input {b.name!r}")
        env[b.name] = args[b.name]
    for node in graph.nodes:
        run_node(node, env, alloc)
    return [env[name] for name in graph.outputs]


def run_node(node: Node, env: Env, alloc: Alloc = empty) -> None:
    if isinstance(node, Pointwise):
        out = env[node.out.name] = alloc(node.out)
        out.copy_(evaluate(node.body, env, node.out.shape, ()).expand(node.out.shape))
    elif isinstance(node, Reduction):
        for b, value in zip(node.outs, reduce(node, env), strict=True):
            env[b.name] = alloc(b)
            env[b.name].copy_(value.expand(b.shape))
    elif isinstance(node, Scatter):
        _scatter(node, env)
    elif isinstance(node, Extern):
        env[node.out.name] = alloc(node.out)
        env[node.out.name].copy_(_extern(node, env))
    elif isinstance(node, Fallback):
        _fallback(node, env, alloc)
    elif isinstance(node, Cond):
        _cond(node, env, alloc)
    else:
        _while(node, env, alloc)


# -- expressions -----------------------------------------------------------------------------

def loop_vars(ranges: tuple[int, ...], reduce_ranges: tuple[int, ...]) -> dict[str, torch.Tensor]:
    sizes = (*ranges, *reduce_ranges)
    names = [f"i{k}" for k in range(len(ranges))] + [f"r{k}" for k in range(len(reduce_ranges))]
    out = {}
    for axis, (name, size) in enumerate(zip(names, sizes, strict=True)):
        shape = [1] * len(sizes)
        shape[axis] = size
        out[name] = torch.arange(size, dtype=torch.int64).reshape(shape)
    return out


def evaluate(root: Expr, env: Env, ranges: tuple[int, ...], reduce_ranges: tuple[int, ...]) -> torch.Tensor:
    """root over the domain ranges x reduce_ranges, broadcast to it."""
    variables = loop_vars(ranges, reduce_ranges)
    values: dict[tuple[str, int], torch.Tensor] = {}
    masks: list[torch.Tensor] = []  # keeps every mask alive, so no id() is reused while we memoize

    def go(e: Expr, mask: torch.Tensor | None) -> torch.Tensor:
        if mask is not None:
            masks.append(mask)
        memo = (e.key, id(mask))
        if memo not in values:
            values[memo] = _eval_one(e, mask, go, env, variables)
        return values[memo]

    full = (*ranges, *reduce_ranges)
    return go(root, None).expand(full) if full else go(root, None).reshape(())


Recurse = Callable[[Expr, "torch.Tensor | None"], torch.Tensor]


def _eval_one(e: Expr, mask: torch.Tensor | None, go: Recurse, env: Env,
              variables: dict[str, torch.Tensor]) -> torch.Tensor:
    if e.op is Op.VAR:
        return variables[str(e.arg)]
    if e.op is Op.CONST:
        return torch.tensor(e.arg, dtype=torch_dtype(e.dtype))
    if e.op is Op.LOAD:
        return _load(env[str(e.arg)], [go(a, mask) for a in e.args], mask)
    if e.op is Op.MASKED:
        m = go(e.args[0], mask)
        inner = m if mask is None else (m & mask)
        return torch.where(m, go(e.args[1], inner), go(e.args[2], mask))
    args = [go(a, mask) for a in e.args]
    if e.op is Op.CAST:
        return args[0].to(torch_dtype(e.dtype))
    result = ELEMENTWISE[e.op](*args)
    want = torch_dtype(e.dtype)
    if result.dtype != want:
        raise TypeError(f"interpreter: {e.op.value} gave {result.dtype}, the IR says {want}")
    return result


def _load(t: torch.Tensor, indices: list[torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
    if not indices:
        return t.reshape(())
    if mask is not None:
        # Note: lanes outside the mask may hold any index (a pad's negative one, say); they
        # read element 0 instead, and MASKED discards what they read.
        indices = [torch.where(mask, i, torch.zeros((), dtype=torch.int64)) for i in indices]
    return t[tuple(indices)]


def _pow(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.pow(a, b)


ELEMENTWISE: dict[Op, Callable[..., torch.Tensor]] = {
    Op.WHERE: torch.where, Op.NEG: torch.neg, Op.ABS: torch.abs, Op.EXP: torch.exp,
    Op.EXP2: torch.exp2, Op.EXPM1: torch.expm1, Op.LOG: torch.log, Op.LOG2: torch.log2,
    Op.LOG10: torch.log10, Op.LOG1P: torch.log1p, Op.SQRT: torch.sqrt, Op.RSQRT: torch.rsqrt,
    Op.RECIPROCAL: torch.reciprocal, Op.SIN: torch.sin, Op.COS: torch.cos, Op.TAN: torch.tan,
    Op.ASIN: torch.asin, Op.ACOS: torch.acos, Op.ATAN: torch.atan, Op.SINH: torch.sinh,
    Op.COSH: torch.cosh, Op.TANH: torch.tanh, Op.ASINH: torch.asinh, Op.ACOSH: torch.acosh,
    Op.ATANH: torch.atanh, Op.ERF: torch.erf, Op.ERFINV: torch.erfinv, Op.ERFC: torch.erfc,
    Op.SIGMOID: torch.sigmoid,
    Op.FLOOR: torch.floor, Op.CEIL: torch.ceil, Op.ROUND: torch.round, Op.TRUNC: torch.trunc,
    Op.SIGN: torch.sign, Op.ISNAN: torch.isnan, Op.ISINF: torch.isinf,
    Op.LOGICAL_NOT: torch.logical_not, Op.BITWISE_NOT: torch.bitwise_not,
    Op.ADD: torch.add, Op.SUB: torch.sub, Op.MUL: torch.mul, Op.TRUEDIV: torch.true_divide,
    Op.FLOORDIV: lambda a, b: torch.div(a, b, rounding_mode="floor"),
    Op.MOD: torch.remainder, Op.FMOD: torch.fmod, Op.POW: _pow, Op.MAXIMUM: torch.maximum,
    Op.MINIMUM: torch.minimum, Op.ATAN2: torch.atan2, Op.COPYSIGN: torch.copysign,
    Op.BITWISE_AND: torch.bitwise_and,
    Op.BITWISE_OR: torch.bitwise_or, Op.BITWISE_XOR: torch.bitwise_xor,
    Op.LSHIFT: torch.bitwise_left_shift, Op.RSHIFT: torch.bitwise_right_shift,
    Op.LOGICAL_AND: torch.logical_and, Op.LOGICAL_OR: torch.logical_or,
    Op.LOGICAL_XOR: torch.logical_xor, Op.EQ: torch.eq, Op.NE: torch.ne, Op.LT: torch.lt,
    Op.LE: torch.le, Op.GT: torch.gt, Op.GE: torch.ge,
}


# -- reductions ------------------------------------------------------------------------------

def reduce(node: Reduction, env: Env) -> list[torch.Tensor]:
    body = evaluate(node.body, env, node.ranges, node.reduce_ranges)
    flat = body.reshape(*node.ranges, -1)
    if node.op is ReduceOp.WELFORD:
        mean = flat.mean(-1)
        return [mean, ((flat - mean.unsqueeze(-1)) ** 2).sum(-1)]
    if flat.shape[-1] == 0:
        return [_empty_reduction(node, flat)]
    ops: dict[ReduceOp, Callable[[torch.Tensor], torch.Tensor]] = {
        ReduceOp.SUM: lambda x: x.sum(-1, dtype=x.dtype), ReduceOp.PROD: lambda x: x.prod(-1, dtype=x.dtype),
        ReduceOp.MAX: lambda x: x.amax(-1), ReduceOp.MIN: lambda x: x.amin(-1),
        ReduceOp.ARGMAX: lambda x: x.argmax(-1), ReduceOp.ARGMIN: lambda x: x.argmin(-1),
        ReduceOp.ANY: lambda x: x.any(-1), ReduceOp.ALL: lambda x: x.all(-1),
    }
    return [ops[node.op](flat)]


def _empty_reduction(node: Reduction, flat: torch.Tensor) -> torch.Tensor:
    identity: dict[ReduceOp, Any] = {ReduceOp.SUM: 0, ReduceOp.PROD: 1, ReduceOp.ANY: False,
                                     ReduceOp.ALL: True}
    if node.op not in identity:
        raise ValueError(f"{node.op.value} over an empty range has no value")
    return torch.full(node.ranges, identity[node.op], dtype=flat.dtype)


def _scatter(node: Scatter, env: Env) -> None:
    target = env[node.target]
    idx = tuple(evaluate(e, env, node.ranges, ()).reshape(-1) for e in node.index)
    value = evaluate(node.value, env, node.ranges, ()).reshape(-1)
    target.index_put_(idx, value, accumulate=node.accumulate)


# -- calls -----------------------------------------------------------------------------------

def view_of(v: View, env: Env) -> torch.Tensor:
    base = env[v.buffer]
    return base.as_strided(v.shape, v.stride, base.storage_offset() + v.offset)


def _extern(node: Extern, env: Env) -> torch.Tensor:
    ins = [None if v is None else view_of(v, env) for v in node.inputs]
    p = json.loads(node.params)
    aten: Any = torch.ops.aten
    out: torch.Tensor
    if node.op is ExternOp.MM:
        out = aten.mm(ins[0], ins[1])
    elif node.op is ExternOp.BMM:
        out = aten.bmm(ins[0], ins[1])
    elif node.op is ExternOp.ADDMM:
        out = aten.addmm(ins[0], ins[1], ins[2], beta=p["beta"], alpha=p["alpha"])
    elif node.op is ExternOp.BADDBMM:
        out = aten.baddbmm(ins[0], ins[1], ins[2], beta=p["beta"], alpha=p["alpha"])
    elif node.op is ExternOp.CONVOLUTION:
        out = aten.convolution(ins[0], ins[1], ins[2], p["stride"], p["padding"], p["dilation"],
                                p["transposed"], p["output_padding"], p["groups"])
    else:
        out = aten.scaled_dot_product_attention(
            ins[0], ins[1], ins[2], ins[3], dropout_p=p["dropout_p"], is_causal=p["is_causal"],
            scale=p["scale"], enable_gqa=p["enable_gqa"])
    return out


def fallback_op(target: str) -> Any:
    namespace, name, overload = target.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), name), overload)


def _fallback(node: Fallback, env: Env, alloc: Alloc) -> None:
    tensors = [view_of(v, env) for v in node.inputs]
    spec = json.loads(node.args)
    args = [_unpack(a, tensors) for a in spec["args"]]
    kwargs = {k: _unpack(a, tensors) for k, a in spec["kwargs"].items()}
    result = fallback_op(node.target)(*args, **kwargs)
    results = [] if result is None else list(result) if isinstance(result, tuple | list) else [result]
    for b, value in zip(node.outs, results, strict=True):
        env[b.name] = alloc(b)
        env[b.name].copy_(value)


def _unpack(a: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(a, dict):
        if "input" in a:
            return tensors[a["input"]]
        if "dtype" in a:
            return torch_dtype(DType(a["dtype"]))
        if "float" in a:
            return float.fromhex(a["float"])
        if "device" in a:
            return torch.device(a["device"])
        if "enum" in a:
            return getattr(torch, a["enum"].removeprefix("torch."))
    if isinstance(a, list):
        return [_unpack(x, tensors) for x in a]
    return a


def _cond(node: Cond[Graph], env: Env, alloc: Alloc) -> None:
    pred = bool(view_of(node.pred, env).item())
    sub = node.then_graph if pred else node.else_graph
    _run_sub(sub, [view_of(v, env) for v in node.operands], node.outs, env, alloc)


def _while(node: While[Graph], env: Env, alloc: Alloc) -> None:
    carried = [view_of(v, env).clone() for v in node.carried]
    extra = [view_of(v, env) for v in node.extra]
    while bool(_call(node.cond_graph, [*carried, *extra])[0].item()):
        carried = [t.clone() for t in _call(node.body_graph, [*carried, *extra])]
    for b, value in zip(node.outs, carried, strict=True):
        env[b.name] = alloc(b)
        env[b.name].copy_(value)


def _call(sub: Graph, operands: list[torch.Tensor]) -> list[torch.Tensor]:
    return run_graph(sub, {b.name: t for b, t in zip(sub.inputs, operands, strict=True)})


def _run_sub(sub: Graph, operands: list[torch.Tensor], outs: tuple[Buffer, ...], env: Env,
             alloc: Alloc) -> None:
    for b, value in zip(outs, _call(sub, operands), strict=False):
        env[b.name] = alloc(b)
        env[b.name].copy_(value)
