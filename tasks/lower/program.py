"""From an exported program to an IR graph: walk its nodes, lower each call through the table.

Placeholders become INPUT buffers (user inputs) or WEIGHT buffers (parameters, buffers,
constants, named by their entry in the weights file); each call goes through its lowering, or
through the aten fallback when the table has none; outputs are made real buffers of the graph.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from cache.hashing import canonical_json
from tasks.ir.dtypes import BY_TORCH_NAME, SCALAR_TYPES, DType
from tasks.ir.expr import const
from tasks.ir.nodes import (
    Buffer,
    BufferKind,
    Fallback,
    Graph,
    channels_last_strides,
    contiguous_strides,
    is_dense,
    same_layout,
)
from tasks.lower import serialized as ser
from tasks.lower.consumers import consumers_of
from tasks.lower.context import Call, Lower, LoweringError, OutMeta, nchw_view
from tasks.lower.control import unsupported_higher_order
from tasks.lower.layout import relaid_weights
from tasks.lower.registry import LOWERINGS, TOKEN, lower_fallback
from tasks.lower.values import TensorValue

Json = dict[str, Any]


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
            bound[arg.name] = _default(arg)
        else:
            bound[arg.name] = None
    return bound


def _default(arg: Any) -> Any:
    """A schema argument's default, a dtype as a torch.dtype (the schema gives its ScalarType
    number: triu_indices' dtype=long is 4)."""
    value = arg.default_value
    numbered = isinstance(value, int) and not isinstance(value, bool)
    if arg.name == "dtype" and numbered and value < len(SCALAR_TYPES):
        return getattr(torch, SCALAR_TYPES[value])
    return value


def _empty_result(ctx: Lower, meta: Any, origin: str) -> TensorValue | tuple[TensorValue, ...] | None:
    """Empty tensors for a call whose every output has no elements, or None.

    Note: such a call computes nothing, whatever the op; its lowering would index by sizes of 0
    (a repeat's modulo, a softmax's row), so none runs: each output is a fresh empty buffer."""
    metas = meta if isinstance(meta, tuple) else (meta,)
    if not metas or not all(isinstance(m, OutMeta) and 0 in m.shape for m in metas):
        return None
    made = tuple(_zeros(ctx, m, origin) for m in metas if isinstance(m, OutMeta))
    return made if isinstance(meta, tuple) else made[0]


def _zeros(ctx: Lower, meta: OutMeta, origin: str) -> TensorValue:
    if meta.dtype.is_complex:  # no kiln kernel makes a complex value: torch's zeros does
        out = ctx.new_buffer(meta.shape, meta.dtype)
        args = {"args": [], "kwargs": {"size": list(meta.shape), "dtype": {"dtype": meta.dtype.value}}}
        ctx.emit(Fallback("aten.zeros.default", (out,), (), canonical_json(args).decode(), origin))
        return TensorValue.of(out)
    return ctx.pointwise(meta.shape, meta.dtype, origin, lambda loop: const(0, meta.dtype))


class GraphLowering:
    """Lowers one serialized graph (the main one or a subgraph) into `ctx`."""

    def __init__(self, ctx: Lower, source: Callable[[str], str]) -> None:
        self.ctx = ctx
        self.source = source
        self.env: dict[str, Any] = {}

    def run(self, graph: Json, inputs: Sequence[Buffer | None], writes: Sequence[str | None] = ()) -> Graph:
        """inputs: a buffer per placeholder, None for an effect token; writes: per output of the
        graph (the main graph's), the input or weight it is written back into, or None."""
        placeholders = [ser.decode(arg, lambda name: name) for arg in graph["inputs"]]
        for name, buf in zip(placeholders, inputs, strict=True):
            self.env[name] = TOKEN if buf is None else TensorValue.of(buf)
        outer, self.ctx.consumers = self.ctx.consumers, consumers_of(graph)
        try:
            self._lower_nodes(graph)
        finally:
            self.ctx.consumers = outer
        values = [ser.decode(arg, self.tensor) for arg in graph["outputs"]]
        targets = list(writes) or [None] * len(values)
        # Note: the values written back go last, after the user's outputs (torch lists them first),
        # so the model's outputs keep their positions; Graph.writes names their targets in order.
        kept = [(v, t) for v, t in zip(values, targets, strict=True) if v is not TOKEN]
        ordered = [v for v, t in kept if t is None] + [v for v, t in kept if t is not None]
        names = self.finish_outputs(ordered)  # may add copies: before the nodes are taken
        return Graph(tuple(b for b in inputs if b is not None), tuple(self.ctx.nodes), names,
                     tuple(t for _, t in kept if t is not None))

    def _lower_nodes(self, graph: Json) -> None:
        for node in graph["nodes"]:
            self.call(node, graph["tensor_values"])

    def tensor(self, name: str) -> Any:
        return self.env[name]

    def call(self, node: Json, values: Json) -> None:
        name = str(node["target"]).removeprefix("torch.ops.")
        where = f"\n  while lowering {name} (node {node['name']}){self.source(node['name'])}"
        try:
            outs = ser.output_names(node)
            meta = ser.output_meta(values, outs)
            result = self._lower(node, name, meta)
            check_result(result, meta)
        except LoweringError as err:
            raise LoweringError(f"{err}{where}", err.hint) from None
        except Exception as err:
            raise LoweringError(f"kiln's lowering failed: {type(err).__name__}: {err}{where}",
                                f"a bug in kiln's lowering of {name}; run with --debug for the traceback"
                                ) from err
        self._bind_results(outs, result)
        self._note_layouts(outs, values)

    def _note_layouts(self, outs: list[str | list[str] | None], values: Json) -> None:
        """Remember the buffers whose layout in eager differs from kiln's (row-major) one."""
        names = [n for out in outs for n in (out if isinstance(out, list) else [out]) if n]
        for name in names:
            value = self.env.get(name)
            if not isinstance(value, TensorValue):
                continue
            strides = ser.tensor_meta(values, name)[1]
            if value.is_identity():
                if not same_layout(value.shape, strides, value.buffer.stride):
                    self.ctx.eager_strides[value.buffer.name] = strides
            elif self._a_kernels_nhwc_buffer(value):
                # eager's layout too where eager keeps a channels-last input's (its storage is
                # then kiln's, and as_strided addresses it alike)
                if same_layout(value.shape, strides, channels_last_strides(value.shape)):
                    self.ctx.eager_strides.pop(value.buffer.name, None)
                else:
                    self.ctx.eager_strides[value.buffer.name] = strides

    def _a_kernels_nhwc_buffer(self, value: TensorValue) -> bool:
        """value is a kernel's [N, H, W, C] row-major buffer seen as [N, C, H, W]; not a
        convolution's buffer (NCHW dims, channels-last strides), which a permute views alike."""
        buffer = value.buffer
        return (buffer.name in self.ctx.channels_last and len(buffer.shape) == 4
                and buffer.stride == contiguous_strides(buffer.shape) and value == nchw_view(buffer))

    def _lower(self, node: Json, name: str, meta: Any) -> Any:
        fn = LOWERINGS.get(name)
        args = [(i["name"], ser.decode(i["arg"], self.tensor)) for i in node["inputs"]]
        if name.startswith("higher_order."):
            if fn is None:
                raise unsupported_higher_order(name)
            # Note: "args" holds every input (cond's and while's are all positional); with_effects
            # also passes its op's keyword arguments (serialized kind 2).
            keyword = [i.get("kind") == 2 for i in node["inputs"]]
            call = Call(name, node["name"], {
                "args": [v for _, v in args], "lowering": self,
                "positional": [v for (_, v), kw in zip(args, keyword, strict=True) if not kw],
                "kwargs": {n: v for (n, v), kw in zip(args, keyword, strict=True) if kw}}, meta)
            return fn(self.ctx, call)
        return self.call_op(name, (), dict(args), meta, node["name"])

    def call_op(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], meta: Any,
                origin: str, effectful: bool = False) -> Any:
        """One aten op on lowered values: its lowering, or the aten fallback. An effectful one
        runs even when its outputs are empty."""
        if not effectful and (empty := _empty_result(self.ctx, meta, origin)) is not None:
            return empty
        target = resolve(name)
        call = Call(name, origin, bind(target, args, kwargs), meta)
        if _touches_complex(call.args, meta):
            return lower_fallback(self.ctx, call)  # Note: kiln's kernels compute on no complex value
        return (LOWERINGS.get(name) or lower_fallback)(self.ctx, call)

    def _bind_results(self, outs: list[str | list[str] | None], result: Any) -> None:
        if len(outs) == 1 and isinstance(outs[0], list):
            results = [result]  # one Tensor[] output (split): a list bound to a list of names
        else:
            results = list(result) if isinstance(result, tuple | list) else [result]
        for name, value in zip(outs, results, strict=False):
            if isinstance(name, list):
                self.env.update(zip(name, value, strict=True))
            elif name is not None:
                self.env[name] = value

    def finish_outputs(self, values: list[Any]) -> tuple[str, ...]:
        """Every output a buffer this graph computed, each named once."""
        names: list[str] = []
        produced = {b.name for node in self.ctx.nodes for b in node.outs}
        for value in values:
            if not isinstance(value, TensorValue):
                raise LoweringError(f"the graph returns {value!r}; kiln compiles tensor outputs only")
            # Note: a channels-last buffer (tasks/lower/layout.py) is copied out too: a model's
            # outputs, and a loop body's results (its inputs are row-major), keep eager's layout.
            if not value.is_identity() or value.buffer.name not in produced or value.buffer.name in names \
                    or value.buffer.name in self.ctx.channels_last:
                value = self.ctx.copy(value, "output")
            names.append(value.buffer.name)
        return tuple(names)


def _touches_complex(args: Mapping[str, Any], meta: Any) -> bool:
    values = [x for v in args.values() for x in (v if isinstance(v, list | tuple) else [v])]
    metas = meta if isinstance(meta, tuple) else (meta,)
    return any(isinstance(v, TensorValue) and v.dtype.is_complex for v in values) or \
        any(isinstance(m, OutMeta) and m.dtype.is_complex for m in metas)


def check_result(result: Any, meta: Any) -> None:
    """Every tensor a lowering returns has the shape and dtype torch recorded for it.

    Note: a cheap guard that turns a lowering bug into an error instead of a wrong kernel.
    """
    values = result if isinstance(result, tuple | list) else (result,)
    metas = meta if isinstance(meta, tuple) else (meta,)
    for value, want in zip(values, metas, strict=False):
        if isinstance(value, TensorValue) and isinstance(want, OutMeta) and \
                (value.shape, value.dtype) != (want.shape, want.dtype):
            raise LoweringError(f"kiln's lowering gave {value.dtype.value}{list(value.shape)} where torch "
                                f"has {want.dtype.value}{list(want.shape)}", "a bug in kiln's lowering table")


def resolve(name: str) -> Any:
    """The OpOverload for "aten.add.Tensor"; a clear error for an op torch does not know."""
    found: Any = torch.ops
    try:
        for part in name.split("."):
            found = getattr(found, part)
    except (AttributeError, RuntimeError):
        raise LoweringError(f"{name} has no lowering and no aten fallback: the library that "
                            "defines it is not loaded",
                            "write the op with aten ops, or register a lowering for it in tasks/lower/",
                            ) from None
    if not isinstance(found, torch._ops.OpOverload):
        raise LoweringError(f"{name} is not an aten op, and kiln can only compile or call aten ops")
    return found


def target_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return str(target.name())  # type: ignore[no-untyped-call]
    return getattr(target, "__name__", str(target))


def lower_program(program: Json, source_map: Mapping[str, str], layout: str = "traced") -> Graph:
    """program: trace's program.json, parsed; layout: the config's lower.layout on the cuda target."""
    module = program["graph_module"]
    graph, signature = module["graph"], module["signature"]
    traced = [_placeholder(spec, graph["tensor_values"]) for spec in signature["input_specs"]]
    inputs = relaid_weights(graph, traced, layout)
    device = next((b.device for b in inputs if b is not None), "cpu")
    ctx = Lower(device, layout=layout)
    for was, now in zip(traced, inputs, strict=True):
        if was is not None and now is not None and was.stride != now.stride:
            ctx.eager_strides[now.name] = was.stride  # what as_strided must not assume away

    def source(node: str) -> str:
        line = source_map.get(node)
        return f"\n  at {line}" if line else ""

    writes = _write_targets(signature["output_specs"], [b for b in inputs if b is not None])
    return GraphLowering(ctx, source).run(graph, inputs, writes)


def _write_targets(specs: list[Json], inputs: list[Buffer]) -> list[str | None]:
    """Per graph output: the input or weight buffer it is written back into after the run (an
    input or buffer the model mutates in forward, as torch.export lists them), or None."""
    targets: list[str | None] = []
    for spec in specs:
        kind, body = next(iter(spec.items()))
        if kind == "user_input_mutation":
            targets.append(_buffer_named([b for b in inputs if b.name == body["user_input_name"]], body))
        elif kind in ("buffer_mutation", "parameter_mutation"):
            name = body["buffer_name"] if kind == "buffer_mutation" else body["parameter_name"]
            targets.append(_buffer_named([b for b in inputs if b.weight == name], body))
        elif kind in ("user_output", "token"):
            targets.append(None)
        else:
            raise LoweringError(f"the model's graph has a {kind} output; kiln compiles inference graphs",
                                "call model.eval(), and compute no gradients in forward()")
    return targets


def _buffer_named(matching: list[Buffer], spec: Json) -> str:
    if not matching:
        raise LoweringError(f"the model mutates {spec}, which is none of its inputs or buffers")
    return matching[0].name


_WEIGHT_NAMES = {"parameter": "parameter_name", "buffer": "buffer_name",
                 "tensor_constant": "tensor_constant_name"}


def _placeholder(spec: Json, values: Json) -> Buffer | None:
    kind, body = next(iter(spec.items()))
    if kind == "token":
        return None  # an effect token orders effectful ops in torch's graph; kiln's run is in order
    if kind == "user_input":
        if "as_tensor" not in body["arg"]:
            raise LoweringError(f"input {body['arg']} is not a tensor; kiln compiles tensor inputs only")
        return _dense(ser.input_buffer(values, body["arg"]["as_tensor"]["name"], BufferKind.INPUT))
    if kind in _WEIGHT_NAMES:
        return ser.input_buffer(values, body["arg"]["name"], BufferKind.WEIGHT, body[_WEIGHT_NAMES[kind]])
    raise LoweringError(f"a {kind} input is not supported")


# Note: an input's layout is where the runtime stages a caller's tensor of another layout. The
# example input's layout serves where it is dense (a transposed input, say); an expanded one
# (stride 0) would fold every caller's tensor onto its first row, and one with gaps wastes
# memory, so those take row-major.
def _dense(b: Buffer) -> Buffer:
    return b if is_dense(b.shape, b.stride) else replace(b, stride=contiguous_strides(b.shape))
