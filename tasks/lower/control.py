"""`cond` and `while_loop`: their branches and bodies are lowered like the main graph.

A subgraph's inputs are fresh contiguous buffers bound to the operands at run time, so each
operand is passed as a contiguous view (copied first only if it is not one). Buffer names are
unique across the whole program: subgraphs share the main graph's counter.
"""

from __future__ import annotations

from typing import Any

from tasks.ir.nodes import Buffer, BufferKind, Cond, Graph, View, While, contiguous_strides
from tasks.lower.context import Call, Lower, LoweringError, OutMeta
from tasks.lower.registry import TOKEN, register
from tasks.lower.serialized import OperatorRef
from tasks.lower.values import TensorValue


def operand_view(ctx: Lower, value: Any, origin: str) -> View:
    if not isinstance(value, TensorValue):
        raise LoweringError(f"control-flow operand {value!r} is not a tensor; kiln passes tensors only")
    view = value.strided()
    if view is None or view.stride != contiguous_strides(view.shape) or view.offset:
        view = ctx.copy(value, origin).strided()
        assert view is not None
    return view


def lower_subgraph(ctx: Lower, call: Call, subgraph: Any, operands: list[View]) -> Graph:
    """subgraph: a serialized higher-order op argument, {"graph": ..., "name": ...}."""
    from tasks.lower.program import GraphLowering

    inputs = [Buffer(ctx.name(), v.shape, contiguous_strides(v.shape), v.dtype, ctx.device, BufferKind.INPUT)
              for v in operands]
    sub = Lower(ctx.device, ctx.prefix, [], ctx.counter, layout=ctx.layout, channels_last=ctx.channels_last)
    parent: GraphLowering = call.args["lowering"]
    return GraphLowering(sub, parent.source).run(subgraph["graph"], inputs)


def _outs(ctx: Lower, call: Call) -> tuple[Buffer, ...]:
    metas = call.out if isinstance(call.out, tuple) else (call.out,)
    if not all(isinstance(m, OutMeta) for m in metas):
        raise LoweringError(f"{call.target} returns values that are not tensors")
    return tuple(ctx.new_buffer(m.shape, m.dtype) for m in metas if isinstance(m, OutMeta))


@register("higher_order.cond")
def _cond(ctx: Lower, call: Call) -> tuple[TensorValue, ...]:
    pred, then_gm, else_gm, operands = call.args["args"][:4]
    if not isinstance(pred, TensorValue):
        raise LoweringError("cond with a Python predicate; export specializes those away")
    pred_view = operand_view(ctx, pred, call.origin)
    views = [operand_view(ctx, v, call.origin) for v in operands]
    then_graph = lower_subgraph(ctx, call, then_gm, views)
    else_graph = lower_subgraph(ctx, call, else_gm, views)
    outs = _outs(ctx, call)
    ctx.emit(Cond(pred_view, tuple(views), then_graph, else_graph, outs, call.origin))
    return tuple(TensorValue.of(b) for b in outs)


@register("higher_order.while_loop")
def _while(ctx: Lower, call: Call) -> tuple[TensorValue, ...]:
    cond_gm, body_gm, carried, extra = call.args["args"][:4]
    carried_views = [operand_view(ctx, v, call.origin) for v in carried]
    extra_views = [operand_view(ctx, v, call.origin) for v in extra]
    operands = carried_views + extra_views
    cond_graph = lower_subgraph(ctx, call, cond_gm, operands)
    body_graph = lower_subgraph(ctx, call, body_gm, operands)
    outs = _outs(ctx, call)
    ctx.emit(While(tuple(carried_views), tuple(extra_views), cond_graph, body_graph, outs, call.origin))
    return tuple(TensorValue.of(b) for b in outs)


# The control-flow constructs torch exports that kiln does not compile yet, by op name.
UNSUPPORTED_CONTROL_FLOW = {
    "higher_order.scan": "torch.scan (torch._higher_order_ops.scan)",
    "higher_order.associative_scan": "associative_scan (torch._higher_order_ops.associative_scan)",
    "higher_order.map_impl": "map (torch._higher_order_ops.map / functorch control_flow.map)",
    "higher_order.while_loop_stack_output": "while_loop with stacked outputs",
}


def unsupported_higher_order(name: str) -> LoweringError:
    """The error for a higher-order op with no lowering, naming the construct."""
    construct = UNSUPPORTED_CONTROL_FLOW.get(name)
    if construct is not None:
        return LoweringError(f"{construct} is not supported by kiln yet; kiln compiles torch.cond and "
                             "torch.while_loop", "write the loop as a torch.while_loop")
    return LoweringError(f"{name} has no lowering (a higher-order op)",
                         "kiln compiles the higher-order ops torch.cond and torch.while_loop only")


@register("higher_order.with_effects")
def _with_effects(ctx: Lower, call: Call) -> tuple[Any, ...]:
    """An effectful op threaded on a token: the op itself, run where it stands (kiln runs a
    graph's steps in order), and the token passed on. Its results follow the token."""
    token, op, *args = call["positional"]
    if token is not TOKEN or not isinstance(op, OperatorRef):
        raise LoweringError(f"with_effects of {op!r}: expected a token and an operator")
    metas = call.out if isinstance(call.out, tuple) else (call.out,)
    inner = metas[1:]
    meta = None if all(m is None for m in inner) else inner[0] if len(inner) == 1 else tuple(inner)
    result = call["lowering"].call_op(op.name, tuple(args), call["kwargs"], meta, call.origin, effectful=True)
    results = result if isinstance(result, tuple) else (result,)
    return (TOKEN, *results)
