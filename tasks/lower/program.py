"""From an exported program to an IR graph: walk the FX graph, lower each call through the table.

Placeholders become INPUT buffers (user inputs) or WEIGHT buffers (parameters, buffers,
constants, named by their entry in the weights file); each call goes through its lowering, or
through the aten fallback when the table has none; outputs are made real buffers of the graph.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import fx

from tasks.ir.dtypes import BY_TORCH_NAME, DType
from tasks.ir.nodes import Buffer, BufferKind, Graph
from tasks.lower.context import Call, Lower, LoweringError, OutMeta
from tasks.lower.registry import LOWERINGS, lower_fallback
from tasks.lower.values import TensorValue


def dtype_of(t: torch.dtype) -> DType:
    name = str(t).removeprefix("torch.")
    if name not in BY_TORCH_NAME:
        raise LoweringError(f"dtype {name} is not supported by kiln's IR")
    return BY_TORCH_NAME[name]


def static_shape(shape: Any, what: str) -> tuple[int, ...]:
    out = []
    for size in shape:
        if not isinstance(size, int):
            try:
                size = int(size)
            except Exception as err:  # a SymInt without a hint
                raise LoweringError(f"{what} has a dynamic size ({size}); kiln compiles static "
                                    "shapes only: export with concrete example inputs") from err
        out.append(size)
    return tuple(out)


def out_meta(val: Any, what: str) -> OutMeta | tuple[OutMeta | None, ...] | None:
    if isinstance(val, torch.Tensor):
        return OutMeta(static_shape(val.shape, what), dtype_of(val.dtype))
    if isinstance(val, list | tuple):
        return tuple(m if isinstance(m := out_meta(v, what), OutMeta) else None for v in val)
    return None


def bind(target: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The call's arguments by schema name, defaults filled in."""
    bound: dict[str, Any] = {}
    positional = list(args)
    for arg in target._schema.arguments:
        if positional and not arg.kwarg_only:
            bound[arg.name] = positional.pop(0)
        elif arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
        else:
            bound[arg.name] = None
    return bound


class GraphLowering:
    """Lowers one FX graph (the main one or a subgraph) into `ctx`."""

    def __init__(self, ctx: Lower, source: Callable[[str], str]) -> None:
        self.ctx = ctx
        self.source = source
        self.env: dict[str, Any] = {}

    def run(self, gm: fx.GraphModule, inputs: list[Buffer]) -> Graph:
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for node, buf in zip(placeholders, inputs, strict=True):
            self.env[node.name] = TensorValue.of(buf)
        outputs: list[Any] = []
        for node in gm.graph.nodes:
            if node.op == "call_function":
                self.env[node.name] = self.call(node)
            elif node.op == "get_attr":
                self.env[node.name] = getattr(gm, str(node.target))
            elif node.op == "output":
                result = node.args[0]
                outputs = list(result) if isinstance(result, list | tuple) else [result]
        names = self.finish_outputs([self.value(o) for o in outputs])
        return Graph(tuple(inputs), tuple(self.ctx.nodes), names)

    def value(self, arg: Any) -> Any:
        if isinstance(arg, fx.Node):
            return self.env[arg.name]
        if isinstance(arg, list | tuple):
            return type(arg)(self.value(a) for a in arg)
        return arg

    def call(self, node: fx.Node) -> Any:
        if node.target is operator.getitem:
            seq, i = self.value(node.args[0]), node.args[1]
            return seq[i]
        name = target_name(node.target)
        try:
            return self._lower(node, name)
        except LoweringError as err:
            raise LoweringError(f"{err}\n  while lowering {name} (node {node.name})"
                                f"{self.source(node.name)}", err.hint) from None

    def _lower(self, node: fx.Node, name: str) -> Any:
        meta = out_meta(node.meta.get("val"), f"{name} (node {node.name})")
        fn = LOWERINGS.get(name)
        if isinstance(node.target, torch._ops.HigherOrderOperator):
            if fn is None:
                raise LoweringError(f"{name} has no lowering (a higher-order op)")
            args = {"args": self.value(node.args), "kwargs": self.value(node.kwargs), "lowering": self}
            return fn(self.ctx, Call(name, node.name, args, meta))
        if not isinstance(node.target, torch._ops.OpOverload):
            raise LoweringError(f"{name} is not an aten op, and kiln can only compile or call aten ops")
        args = bind(node.target, self.value(node.args), self.value(node.kwargs))
        call = Call(name, node.name, args, meta)
        return (fn or lower_fallback)(self.ctx, call)

    def finish_outputs(self, values: list[Any]) -> tuple[str, ...]:
        """Every output a buffer this graph computed, each named once."""
        names: list[str] = []
        produced = {b.name for node in self.ctx.nodes for b in node.outs}
        for value in values:
            if not isinstance(value, TensorValue):
                raise LoweringError(f"the graph returns {value!r}; kiln compiles tensor outputs only")
            if not value.is_identity() or value.buffer.name not in produced or value.buffer.name in names:
                value = self.ctx.copy(value, "output")
            names.append(value.buffer.name)
        return tuple(names)


def target_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return str(target.name())  # type: ignore[no-untyped-call]
    return getattr(target, "__name__", str(target))


def lower_program(ep: torch.export.ExportedProgram, source_map: Mapping[str, str]) -> Graph:
    sig = ep.graph_signature
    if sig.buffers_to_mutate or sig.user_inputs_to_mutate:
        raise LoweringError("the model mutates its buffers or inputs in forward(); kiln compiles "
                            "inference graphs: call model.eval() and avoid in-place updates of state")
    weights = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    inputs = [placeholder_buffer(n, weights.get(n.name, "")) for n in ep.graph.nodes if n.op == "placeholder"]
    device = inputs[0].device if inputs else "cpu"

    def source(node: str) -> str:
        line = source_map.get(node)
        return f"\n  at {line}" if line else ""

    return GraphLowering(Lower(device), source).run(ep.graph_module, inputs)


def placeholder_buffer(node: fx.Node, weight: str) -> Buffer:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise LoweringError(f"input {node.name!r} is {type(val).__name__}; kiln compiles tensor inputs only")
    shape = static_shape(val.shape, f"input {node.name!r}")
    stride = static_shape(val.stride(), f"input {node.name!r}")
    kind = BufferKind.WEIGHT if weight else BufferKind.INPUT
    return Buffer(node.name, shape, stride, dtype_of(val.dtype), val.device.type, kind, weight)
