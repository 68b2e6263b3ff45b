"""The graph: buffers, and the nodes that compute them, in program order.

A `Pointwise` node computes out[i0, .., in] = body over out's shape. A `Reduction` computes,
for each i over its `ranges`, a reduction of body over `reduce_ranges` (variables r0..); its
outputs have shape `ranges` (welford has two: mean and m2). Loads name buffers and index them
with one expression per dimension, so a view is never a node: it is an index expression.
Extern calls (matmul, convolution, attention) and aten fallbacks take strided `View`s of
buffers, since the kernels they call read strides. `Cond` and `While` hold subgraphs: IR
`Graph`s here, and in a schedule the same nodes hold `ScheduledGraph`s (they are its control
steps), so the schedule mirrors no IR class. `children`, `with_children` and `control_reads`
are the one protocol every walk over subgraphs uses, for either kind of graph.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar, cast

from tasks.ir.dtypes import DType
from tasks.ir.expr import Expr


class ReduceOp(enum.Enum):
    SUM = "sum"
    PROD = "prod"
    MAX = "max"
    MIN = "min"
    ARGMAX = "argmax"  # first index of the max, over the flattened reduction ranges
    ARGMIN = "argmin"
    WELFORD = "welford"  # outputs (mean, m2); m2 = sum((x - mean)^2)
    ANY = "any"
    ALL = "all"


class ExternOp(enum.Enum):
    MM = "mm"
    BMM = "bmm"
    ADDMM = "addmm"  # params: beta, alpha
    BADDBMM = "baddbmm"
    CONVOLUTION = "convolution"  # params: stride, padding, dilation, transposed, output_padding, groups
    SDPA = "scaled_dot_product_attention"  # params: dropout_p, is_causal, scale, enable_gqa


class BufferKind(enum.Enum):
    INPUT = "input"  # a user input of the graph
    WEIGHT = "weight"  # a parameter, buffer or constant: read from the weights file
    TEMP = "temp"  # computed by a node


@dataclass(frozen=True, slots=True)
class Buffer:
    name: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: DType
    device: str
    kind: BufferKind = BufferKind.TEMP
    weight: str = ""  # the weights-file entry of a WEIGHT buffer

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes the buffer spans in memory (its strides may leave gaps)."""
        if any(size == 0 for size in self.shape):
            return 0
        span = 1 + sum((size - 1) * stride for size, stride in zip(self.shape, self.stride, strict=True))
        return span * self.dtype.itemsize


def same_layout(shape: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether strides a and b lay `shape` out alike (a size-1 dim's stride is free)."""
    return all(x == y for size, x, y in zip(shape, a, b, strict=True) if size != 1)


def is_dense(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether `stride` lays `shape` out densely: a permutation of row-major (no gaps, no
    overlap; a size-1 dim's stride is free)."""
    if len(stride) != len(shape):
        return False
    expected = 1
    for size, step in sorted(((n, s) for n, s in zip(shape, stride, strict=True) if n != 1),
                             key=lambda dim: dim[1]):
        if step != expected:
            return False
        expected *= size
    return True


def channels_last_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """[N, C, H, W]'s strides with C innermost, then W, H, N."""
    _, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(strides))


@dataclass(frozen=True, slots=True)
class View:
    """A strided window onto a buffer, for the calls that take tensors (externs, fallbacks)."""

    buffer: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: DType


@dataclass(frozen=True, slots=True)
class Pointwise:
    out: Buffer
    body: Expr
    origin: str = ""  # the fx node it was lowered from; names kernels, never joins a key

    @property
    def outs(self) -> tuple[Buffer, ...]:
        return (self.out,)


@dataclass(frozen=True, slots=True)
class Reduction:
    outs: tuple[Buffer, ...]  # shape == ranges
    op: ReduceOp
    ranges: tuple[int, ...]
    reduce_ranges: tuple[int, ...]
    body: Expr  # over i0.. and r0..
    origin: str = ""


@dataclass(frozen=True, slots=True)
class Scatter:
    """In place: target[index(i..)] (op)= value(i..) over `ranges`. Runs after target's producer."""

    target: str
    ranges: tuple[int, ...]
    index: tuple[Expr, ...]  # one expression per target dimension
    value: Expr
    accumulate: bool
    origin: str = ""

    @property
    def outs(self) -> tuple[Buffer, ...]:
        return ()


@dataclass(frozen=True, slots=True)
class Extern:
    op: ExternOp
    out: Buffer
    inputs: tuple[View | None, ...]  # None for an absent optional input (no bias, no mask)
    params: str  # canonical JSON of the scalar arguments
    origin: str = ""

    @property
    def outs(self) -> tuple[Buffer, ...]:
        return (self.out,)


@dataclass(frozen=True, slots=True)
class Fallback:
    """An aten op kiln does not compile: called as it is, counted as "not compiled"."""

    target: str  # e.g. "aten.cumsum.default"
    outs: tuple[Buffer, ...]
    inputs: tuple[View, ...]
    args: str  # canonical JSON of (args, kwargs), tensors as {"input": n}
    origin: str = ""


G = TypeVar("G")  # a subgraph: an IR Graph, or a schedule's ScheduledGraph


@dataclass(frozen=True, slots=True)
class Cond(Generic[G]):
    pred: View  # a bool (or int) scalar
    operands: tuple[View, ...]
    then_graph: G
    else_graph: G
    outs: tuple[Buffer, ...]
    origin: str = ""


@dataclass(frozen=True, slots=True)
class While(Generic[G]):
    """carried = operands; while cond_graph(carried, extra): carried = body_graph(carried, extra)."""

    carried: tuple[View, ...]
    extra: tuple[View, ...]
    cond_graph: G
    body_graph: G
    outs: tuple[Buffer, ...]
    origin: str = ""


Node = Pointwise | Reduction | Scatter | Extern | Fallback | Cond["Graph"] | While["Graph"]
# a subgraph's part name -> its field: the order of children() and with_children()
_PARTS = {Cond: (("then", "then_graph"), ("else", "else_graph")),
          While: (("cond", "cond_graph"), ("body", "body_graph"))}


def children(node: Any) -> tuple[tuple[str, Any], ...]:
    """A node's or a step's subgraphs with their part names ("then", "else" / "cond", "body");
    () for anything that holds none."""
    parts = _PARTS.get(type(node), ())
    return tuple((part, getattr(node, name)) for part, name in parts)


def with_children(node: Cond[Any] | While[Any], graphs: Sequence[G]) -> Cond[G] | While[G]:
    """The same control node over other subgraphs (in children()'s order): how the schedule
    makes its control steps from the IR's control nodes."""
    names = [name for _, name in _PARTS[type(node)]]
    fields: dict[str, Any] = dict(zip(names, graphs, strict=True))
    original: Any = node
    return cast(Cond[G] | While[G], replace(original, **fields))


def control_reads(node: Cond[Any] | While[Any]) -> tuple[View, ...]:
    """What a control node reads from its graph: a cond's predicate and operands, a loop's
    carried and extra values."""
    return (node.pred, *node.operands) if isinstance(node, Cond) else (*node.carried, *node.extra)


@dataclass(frozen=True, slots=True)
class Graph:
    inputs: tuple[Buffer, ...]  # user inputs (INPUT) then weights (WEIGHT), or a subgraph's operands
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]  # buffer names; every output is a buffer some node computed
    # Note: a model that mutates an input or a buffer in forward() has those values as its
    # last outputs; writes names, in order, the input or weight buffer each is copied into
    # after the run (the runtime does it), as eager leaves them. Only the main graph has any.
    writes: tuple[str, ...] = ()

    def user_outputs(self) -> tuple[str, ...]:
        """The outputs the model returns: all but the values written back."""
        return self.outputs[:len(self.outputs) - len(self.writes)]

    def buffers(self) -> dict[str, Buffer]:
        found = {b.name: b for b in self.inputs}
        for node in self.nodes:
            found.update((b.name, b) for b in node.outs)
        return found

    def subgraphs(self) -> Iterator[tuple[str, Graph]]:
        for node in self.nodes:
            for part, graph in children(node):
                yield f"{getattr(node, 'origin', '')}.{part}", graph


def node_inputs(node: Node) -> list[str]:
    """Buffers a node reads, in first-use order."""
    from tasks.ir.expr import buffers_read

    if isinstance(node, Pointwise | Reduction):
        return buffers_read(node.body)
    if isinstance(node, Scatter):
        names = [node.target]
        for e in (*node.index, node.value):
            names += buffers_read(e)
        return list(dict.fromkeys(names))
    if isinstance(node, Extern):
        return list(dict.fromkeys(v.buffer for v in node.inputs if v is not None))
    if isinstance(node, Fallback):
        return list(dict.fromkeys(v.buffer for v in node.inputs))
    return list(dict.fromkeys(v.buffer for v in control_reads(node)))


def node_writes(node: Node) -> list[str]:
    if isinstance(node, Scatter):
        return [node.target]
    return [b.name for b in node.outs]
