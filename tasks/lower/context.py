"""The state of one graph's lowering: the nodes emitted so far, and helpers every lowering uses.

Each lowering function gets a `Lower` and a `Call` (the aten call with its arguments bound by
name and its output's shape and dtype) and returns a TensorValue, a tuple of them, or a Python
value. It emits nodes through `pointwise`, `reduction`, `extern` and `fallback`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from cache.hashing import canonical_json
from tasks.ir.dtypes import DType
from tasks.ir.expr import Expr, buffers_read, cast, const
from tasks.ir.nodes import (
    Buffer,
    Extern,
    ExternOp,
    Fallback,
    Node,
    Pointwise,
    ReduceOp,
    Reduction,
    View,
    contiguous_strides,
)
from tasks.lower.layout import NCHW_IN_NHWC, nhwc_body, nhwc_shape
from tasks.lower.values import Loop, TensorValue, view_var


class LoweringError(Exception):
    """A graph kiln cannot express; the message says what and why, the hint what to do."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint or "kiln's lowering table (tasks/lower/) cannot express this yet"


@dataclass(frozen=True)
class OutMeta:
    shape: tuple[int, ...]
    dtype: DType
    stride: tuple[int, ...] | None = None  # eager's layout in the trace, where the program records it


@dataclass
class Call:
    target: str  # "aten.add.Tensor"
    origin: str  # the fx node's name
    args: dict[str, Any]  # bound by schema name; tensors are TensorValues
    out: OutMeta | tuple[OutMeta | None, ...] | None

    def __getitem__(self, name: str) -> Any:
        return self.args[name]

    @property
    def meta(self) -> OutMeta:
        assert isinstance(self.out, OutMeta), f"{self.target}: expected one tensor output"
        return self.out

    def tensor(self, name: str) -> TensorValue:
        value = self.args[name]
        if not isinstance(value, TensorValue):
            raise LoweringError(f"{self.target}: argument {name!r} is {value!r}, not a tensor")
        return value


@dataclass
class Lower:
    device: str
    prefix: str = "buf"
    nodes: list[Node] = field(default_factory=list)
    counter: list[int] = field(default_factory=lambda: [0])  # shared with subgraphs
    # Buffers whose strides in eager differ from kiln's row-major ones: what as_strided,
    # which addresses storage, must not assume away.
    eager_strides: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # Values derived once per graph whatever the number of their users (see `derived`).
    derived_values: dict[Hashable, TensorValue] = field(default_factory=dict)
    # Per fx value of the graph being lowered: what reads it (tasks/lower/consumers.py).
    consumers: dict[str, list[tuple[str, list[str]]]] = field(default_factory=dict)
    # "auto": a half-precision conv net's activations channels-last on the GPU (tasks/lower/layout.py)
    layout: str = "traced"
    # Buffers whose 4-d values are channels-last (shared with subgraphs): a kernel that reads
    # one writes one (`_nhwc`).
    channels_last: set[str] = field(default_factory=set)

    def name(self) -> str:
        self.counter[0] += 1
        return f"{self.prefix}{self.counter[0] - 1}"

    def new_buffer(self, shape: tuple[int, ...], dtype: DType,
                   stride: tuple[int, ...] | None = None) -> Buffer:
        layout = contiguous_strides(shape) if stride is None else stride
        return Buffer(self.name(), shape, layout, dtype, self.device)

    def emit(self, node: Node) -> None:
        self.nodes.append(node)

    def derived(self, key: Hashable, make: Callable[[], TensorValue]) -> TensorValue:
        """make()'s value, made once per graph for each key: every later caller shares it."""
        if key not in self.derived_values:
            self.derived_values[key] = make()
        return self.derived_values[key]

    def pointwise(self, shape: tuple[int, ...], dtype: DType, origin: str,
                  body: Callable[[Loop], Expr], row_major: bool = False) -> TensorValue:
        """The body's value in a new buffer: row-major, or channels-last after a channels-last
        input unless `row_major` (a copy whose buffer others address: a scatter's, an output's)."""
        loop = Loop(shape)
        expr = cast(body(loop), dtype)
        if not row_major and self._nhwc(shape, expr):
            out = self.new_buffer(nhwc_shape(shape), dtype)
            self.emit(Pointwise(out, nhwc_body(expr), origin))
            return self._nchw_view(out)
        out = self.new_buffer(shape, dtype)
        self.emit(Pointwise(out, expr, origin))
        return TensorValue.of(out)

    def _nhwc(self, shape: tuple[int, ...], body: Expr) -> bool:
        """Whether a kernel of this shape, computing `body`, writes channels-last: a 4-d one
        with channels and a plane, reading a channels-last buffer."""
        if not self.channels_last or len(shape) != 4 or shape[1] == 1 or shape[2] * shape[3] == 1:
            return False
        return any(name in self.channels_last for name in buffers_read(body))

    def _nchw_view(self, out: Buffer) -> TensorValue:
        """An [N, H, W, C] buffer's value: its [N, C, H, W] view, channels-last in memory."""
        self.channels_last.add(out.name)
        view = nchw_view(out)
        # eager's NCHW, until the trace says (Lowering._note_layouts: a channels-last input's)
        self.eager_strides[out.name] = contiguous_strides(view.shape)
        return view

    def reduction(self, op: ReduceOp, shape: tuple[int, ...], reduce: tuple[int, ...],
                  origin: str, body: Callable[[Loop], Expr]) -> tuple[TensorValue, ...]:
        # Note: a reduction over no dimension (a 0-d tensor's amax, argmax, mean) reduces one
        # element; every kernel kind has a reduction loop, so it gets one of one iteration.
        reduce = reduce or (1,)
        loop = Loop(shape, reduce)
        expr = body(loop)
        if op is ReduceOp.WELFORD:
            dtypes = [expr.dtype, expr.dtype]
        elif op in (ReduceOp.ARGMAX, ReduceOp.ARGMIN):
            dtypes = [DType.I64]
        elif op in (ReduceOp.ANY, ReduceOp.ALL):
            expr, dtypes = cast(expr, DType.BOOL), [DType.BOOL]
        else:
            dtypes = [expr.dtype]
        if self._nhwc(shape, expr):  # a max pool's window over a channels-last input, say
            outs = tuple(self.new_buffer(nhwc_shape(shape), d) for d in dtypes)
            self.emit(Reduction(outs, op, nhwc_shape(shape), reduce, nhwc_body(expr), origin))
            return tuple(self._nchw_view(b) for b in outs)
        outs = tuple(self.new_buffer(shape, d) for d in dtypes)
        self.emit(Reduction(outs, op, shape, reduce, expr, origin))
        return tuple(TensorValue.of(b) for b in outs)

    def realize(self, value: TensorValue, origin: str) -> TensorValue:
        """The value in a buffer of its own, unless it already is one."""
        return value if value.is_identity() else self.copy(value, origin)

    def copy(self, value: TensorValue, origin: str) -> TensorValue:
        """A fresh contiguous buffer holding the value (a scatter's target, say)."""
        if value.dtype.is_complex:
            return self.complex_copy(value, origin)
        return self.pointwise(value.shape, value.dtype, origin, lambda loop: loop.load(value, loop.idx),
                              row_major=True)

    def complex_copy(self, value: TensorValue, origin: str) -> TensorValue:
        """A complex value's copy, by torch (aten.clone): no kiln kernel computes on complex."""
        strided = value.strided()
        if strided is None:
            raise LoweringError("a complex value kiln would have to compute a layout for",
                                "kiln passes complex tensors between torch's ops only")
        out = self.new_buffer(value.shape, value.dtype)
        args = canonical_json({"args": [], "kwargs": {"self": {"input": 0}}}).decode()
        self.emit(Fallback("aten.clone.default", (out,), (strided,), args, origin))
        return TensorValue.of(out)

    def view(self, value: TensorValue, origin: str) -> View:
        """A strided view for a call that takes tensors; copies only what strides cannot say."""
        strided = value.strided()
        if strided is None or any(s < 0 for s in strided.stride):
            # Note: a flip has negative strides, which BLAS, aten and as_strided refuse.
            strided = self.copy(value, origin).strided()
            assert strided is not None
        return strided

    def extern(self, op: ExternOp, inputs: list[TensorValue | None], params: dict[str, Any],
               call: Call, stride: tuple[int, ...] | None = None) -> TensorValue:
        """The call into a new buffer: row-major, or laid out by `stride`."""
        views = tuple(None if v is None else self.view(v, call.origin) for v in inputs)
        out = self.new_buffer(call.meta.shape, call.meta.dtype, stride)
        self.emit(Extern(op, out, views, canonical_json(params).decode(), call.origin))
        return TensorValue.of(out)


def scalar(value: Any, dtype: DType) -> Expr:
    return const(value, dtype)


def params_json(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


def nchw_view(out: Buffer) -> TensorValue:
    """An [N, H, W, C] buffer as the [N, C, H, W] value it holds."""
    n, h, w, c = out.shape
    return TensorValue(out, (n, c, h, w), tuple(view_var(NCHW_IN_NHWC.index(b)) for b in range(4)))
