"""Ops that move elements: cat, stack, pad, gather, embedding, index, scatter, arange.

Reads at data-dependent positions are loads whose index contains a load (indirect indexing).
Pieces of a cat and the border of a pad are `masked` loads: a lane outside the piece never
reads, so no load is ever out of bounds. Scatter writes in place into a fresh copy of its
input, which the scheduler never inlines.
"""

from __future__ import annotations

from functools import reduce
from typing import Any

from tasks.ir import index as ix
from tasks.ir.dtypes import DType
from tasks.ir.expr import Expr, Op, binary, cast, const, masked, where
from tasks.ir.nodes import Scatter
from tasks.lower.by_index import index_contribution, masked_scatter, reduce_by_index, scatter_contribution
from tasks.lower.context import Call, Lower, LoweringError
from tasks.lower.registry import lower_fallback, register
from tasks.lower.values import Loop, TensorValue
from tasks.lower.views import reshape


def _and(conds: list[Expr]) -> Expr:
    return reduce(lambda a, b: binary(Op.LOGICAL_AND, a, b), conds)


def _in_range(i: Expr, lo: int, hi: int, size: int) -> list[Expr]:
    """Conditions for lo <= i < hi, leaving out the ones i's range already keeps."""
    conds = []
    if lo > 0:
        conds.append(binary(Op.GE, i, ix.const(lo)))
    if hi < size:
        conds.append(binary(Op.LT, i, ix.const(hi)))
    return conds


@register("aten.cat.default", "aten.concat.default")
def _cat(ctx: Lower, call: Call) -> TensorValue:
    meta = call.meta
    pieces = [t for t in call["tensors"] if not (t.ndim == 1 and t.numel == 0 and len(meta.shape) > 1)]
    dim = call["dim"] % max(len(meta.shape), 1)
    dtype = meta.dtype.compute

    def body(loop: Loop) -> Expr:
        i = loop.idx[dim]
        offsets = [0]
        for t in pieces:
            offsets.append(offsets[-1] + t.shape[dim])
        result: Expr = const(0, dtype)
        for k in reversed(range(len(pieces))):
            lo, hi = offsets[k], offsets[k + 1]
            if hi == lo:
                continue
            idx = list(loop.idx)
            idx[dim] = ix.add(i, ix.const(-lo))
            value = cast(loop.load(pieces[k], tuple(idx)), dtype)
            conds = _in_range(i, lo, hi, meta.shape[dim])
            result = masked(_and(conds), value, result) if conds else value
        return result

    return ctx.pointwise(meta.shape, meta.dtype, call.origin, body)


@register("aten.stack.default")
def _stack(ctx: Lower, call: Call) -> TensorValue:
    tensors = call["tensors"]
    dim = call["dim"] % (tensors[0].ndim + 1)
    shape = call.meta.shape
    pieces = [reshape(t, (*t.shape[:dim], 1, *t.shape[dim:])) for t in tensors]
    inner = Call("aten.cat.default", call.origin, {"tensors": pieces, "dim": dim}, call.out)
    assert shape[dim] == len(tensors)
    result: TensorValue = _cat(ctx, inner)
    return result


@register("aten.constant_pad_nd.default")
def _pad(ctx: Lower, call: Call) -> TensorValue:
    x, pad, fill = call.tensor("self"), list(call["pad"]), call["value"]
    meta = call.meta
    dtype = meta.dtype.compute

    def body(loop: Loop) -> Expr:
        idx, conds = list(loop.idx), []
        for p in range(len(pad) // 2):
            d = x.ndim - 1 - p
            left = pad[2 * p]
            idx[d] = ix.add(loop.idx[d], ix.const(-left))
            conds += _in_range(loop.idx[d], left, left + x.shape[d], meta.shape[d])
        value = cast(loop.load(x, tuple(idx)), dtype)
        return masked(_and(conds), value, const(fill, dtype)) if conds else value

    return ctx.pointwise(meta.shape, meta.dtype, call.origin, body)


def index_value(loop: Loop, index: TensorValue, at: tuple[Expr, ...], size: int, wrap: bool) -> Expr:
    """An index tensor's element as an int64 position, negative ones wrapped when asked."""
    i = cast(loop.load(index, at), DType.I64)
    if wrap:
        i = where(binary(Op.LT, i, ix.const(0)), binary(Op.ADD, i, ix.const(size)), i)
    return i


@register("aten.index_select.default")
def _index_select(ctx: Lower, call: Call) -> TensorValue:
    x, index = call.tensor("self"), call.tensor("index")
    dim = call["dim"] % max(x.ndim, 1)

    def body(loop: Loop) -> Expr:
        idx = list(loop.idx)
        if x.ndim:
            idx[dim] = index_value(loop, index, (loop.idx[dim],) if index.ndim else (), x.shape[dim], True)
        return loop.load(x, tuple(idx))

    return ctx.pointwise(call.meta.shape, call.meta.dtype, call.origin, body)


@register("aten.gather.default")
def _gather(ctx: Lower, call: Call) -> TensorValue:
    x, index = call.tensor("self"), call.tensor("index")
    dim = call["dim"] % max(x.ndim, 1)

    def body(loop: Loop) -> Expr:
        idx = list(loop.idx)
        if x.ndim:
            idx[dim] = index_value(loop, index, loop.idx, x.shape[dim], True)
        return loop.load(x, tuple(idx))

    return ctx.pointwise(call.meta.shape, call.meta.dtype, call.origin, body)


@register("aten.embedding.default")
def _embedding(ctx: Lower, call: Call) -> TensorValue:
    weight, indices = call.tensor("weight"), call.tensor("indices")
    n = indices.ndim

    def body(loop: Loop) -> Expr:
        row = index_value(loop, indices, loop.idx[:n], weight.shape[0], False)
        return loop.load(weight, (row, *loop.idx[n:]))

    return ctx.pointwise(call.meta.shape, call.meta.dtype, call.origin, body)


@register("aten.index.Tensor", "aten._unsafe_index.Tensor")
def _index(ctx: Lower, call: Call) -> Any:
    x = call.tensor("self")
    indices: list[TensorValue | None] = list(call["indices"])
    if any(t is not None and t.dtype is DType.BOOL for t in indices):
        fallback: TensorValue = lower_fallback(ctx, call)
        return fallback  # a boolean mask: the output's size depends on the data
    indices += [None] * (x.ndim - len(indices))
    used = [k for k, t in enumerate(indices) if t is not None]
    shapes = [t.shape for t in indices if t is not None]
    bshape = _broadcast(shapes)
    adjacent = used == list(range(used[0], used[-1] + 1))
    first = used[0] if adjacent else 0
    meta = call.meta

    def body(loop: Loop) -> Expr:
        out = list(loop.idx)
        b_idx = tuple(out[first:first + len(bshape)])
        rest = iter(out[:first] + out[first + len(bshape):])
        idx: list[Expr] = []
        for k, t in enumerate(indices):
            if t is None:
                idx.append(next(rest))
            else:
                at = _broadcast_at(t.shape, bshape, b_idx)
                idx.append(index_value(loop, t, at, x.shape[k], True))
        return loop.load(x, tuple(idx))

    return ctx.pointwise(meta.shape, meta.dtype, call.origin, body)


def _broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    n = max(len(s) for s in shapes)
    out = [1] * n
    for s in shapes:
        for k, size in enumerate(s):
            pos = n - len(s) + k
            if size != 1:
                out[pos] = size
    return tuple(out)


def _broadcast_at(shape: tuple[int, ...], bshape: tuple[int, ...],
                  b_idx: tuple[Expr, ...]) -> tuple[Expr, ...]:
    lead = len(bshape) - len(shape)
    return tuple(ix.const(0) if size == 1 else b_idx[lead + k] for k, size in enumerate(shape))


def _scatter_into(ctx: Lower, call: Call, x: TensorValue, ranges: tuple[int, ...],
                  index_of: Any, value_of: Any, accumulate: bool) -> TensorValue:
    target = ctx.copy(x, call.origin)
    loop = Loop(ranges)
    dtype = x.dtype
    index = tuple(index_of(loop))
    value = cast(value_of(loop), dtype)
    ctx.emit(Scatter(target.buffer.name, ranges, index, value, accumulate, call.origin))
    return target


@register("aten.scatter.src", "aten.scatter.value", "aten.scatter_add.default", "aten.scatter.reduce",
          "aten.scatter.value_reduce", "aten.scatter_reduce.two")
def _scatter(ctx: Lower, call: Call) -> TensorValue:
    x, index, dim = call.tensor("self"), call.tensor("index"), call["dim"] % max(call.tensor("self").ndim, 1)
    src: Any = call.args.get("src", call.args.get("value"))
    reduce_mode = call.args.get("reduce")
    accumulate = call.target == "aten.scatter_add.default" or reduce_mode in ("add", "sum")
    if reduce_mode not in (None, "add", "sum") or not call.args.get("include_self", True):
        if not x.ndim:
            fallback: TensorValue = lower_fallback(ctx, call)
            return fallback
        return reduce_by_index(ctx, call, x, reduce_mode or "sum", bool(call.args.get("include_self", True)),
                               scatter_contribution(x, dim, index, src))

    def index_of(loop: Loop) -> list[Expr]:
        idx = list(loop.idx)
        idx[dim] = index_value(loop, index, loop.idx, x.shape[dim], True)
        return idx

    def value_of(loop: Loop) -> Expr:
        if isinstance(src, TensorValue):
            return loop.load(src, loop.idx)
        fill: bool | int | float = src
        return const(fill, x.dtype)

    return _scatter_into(ctx, call, x, index.shape, index_of, value_of, accumulate)


@register("aten.masked_scatter.default")
def _masked_scatter(ctx: Lower, call: Call) -> TensorValue:
    return masked_scatter(ctx, call)


@register("aten.index_reduce.default")
def _index_reduce(ctx: Lower, call: Call) -> TensorValue:
    x, index, source = call.tensor("self"), call.tensor("index"), call.tensor("source")
    if not x.ndim:  # a 0-d tensor indexes as one of shape (1,)
        out = reduce_by_index(ctx, call, reshape(x, (1,)), call["reduce"], bool(call["include_self"]),
                              index_contribution(0, reshape(index, (1,)), reshape(source, (1,))))
        return reshape(out, ())
    return reduce_by_index(ctx, call, x, call["reduce"], bool(call["include_self"]),
                           index_contribution(call["dim"] % x.ndim, index, source))


@register("aten.index_put.default", "aten._unsafe_index_put.default")
def _index_put(ctx: Lower, call: Call) -> TensorValue:
    x, values = call.tensor("self"), call.tensor("values")
    indices: list[TensorValue | None] = list(call["indices"])
    if any(t is None or t.dtype is DType.BOOL for t in indices):
        fallback: TensorValue = lower_fallback(ctx, call)
        return fallback
    bshape = _broadcast([t.shape for t in indices if t is not None])
    ranges = (*bshape, *x.shape[len(indices):])

    def index_of(loop: Loop) -> list[Expr]:
        b_idx = loop.idx[:len(bshape)]
        idx = [index_value(loop, t, _broadcast_at(t.shape, bshape, b_idx), x.shape[k], True)
               for k, t in enumerate(indices) if t is not None]
        return idx + list(loop.idx[len(bshape):])

    def value_of(loop: Loop) -> Expr:
        return loop.load(values, _broadcast_at(values.shape, ranges, loop.idx))

    return _scatter_into(ctx, call, x, ranges, index_of, value_of, bool(call["accumulate"]))


@register("aten.arange.start_step", "aten.arange.default", "aten.arange.start")
def _arange(ctx: Lower, call: Call) -> TensorValue:
    start = call.args.get("start", 0) if call.target != "aten.arange.default" else 0
    step = call.args.get("step", 1)
    meta = call.meta
    if meta.dtype is DType.BOOL:
        raise LoweringError("arange of bool")
    dtype = meta.dtype.compute if meta.dtype.is_float else DType.I64

    def body(loop: Loop) -> Expr:
        i = cast(loop.idx[0], dtype)
        return binary(Op.ADD, binary(Op.MUL, i, const(step, dtype)), const(start, dtype))

    return ctx.pointwise(meta.shape, meta.dtype, call.origin, body)


# -- writing a view of a tensor: slice_scatter, select_scatter, diagonal_scatter --------------
# Each is a pointwise over self's shape: where the position lies in the view, src's element
# there (a masked load: other positions never read src), else self's.

def _view_scatter(ctx: Lower, call: Call,
                  place: Any) -> TensorValue:  # place(loop) -> (conditions, src index) or None
    x, src = call.tensor("self"), call.tensor("src")
    meta = call.meta
    dtype = meta.dtype.compute

    def body(loop: Loop) -> Expr:
        base = cast(loop.load(x, loop.idx), dtype)
        found = place(loop)
        if found is None:  # the view is empty
            return base
        conds, at = found
        value = cast(loop.load(src, at), dtype)
        return masked(_and(conds), value, base) if conds else value

    return ctx.pointwise(meta.shape, meta.dtype, call.origin, body)


@register("aten.slice_scatter.default")
def _slice_scatter(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    dim = call.args.get("dim", 0) % max(x.ndim, 1)
    size = x.shape[dim]
    lo, hi, step = slice(call.args.get("start"), call.args.get("end"), call.args.get("step", 1)).indices(size)
    length = max(0, (hi - lo + step - 1) // step)

    def place(loop: Loop) -> tuple[list[Expr], tuple[Expr, ...]] | None:
        if length == 0:
            return None
        i = loop.idx[dim]
        offset = ix.add(i, ix.const(-lo))
        conds = _in_range(i, lo, lo + (length - 1) * step + 1, size)
        at = list(loop.idx)
        if step == 1:
            at[dim] = offset
        else:
            conds.append(binary(Op.EQ, binary(Op.MOD, offset, ix.const(step)), ix.const(0)))
            at[dim] = binary(Op.FLOORDIV, offset, ix.const(step))
        return conds, tuple(at)

    return _view_scatter(ctx, call, place)


@register("aten.select_scatter.default")
def _select_scatter(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    dim = call["dim"] % max(x.ndim, 1)
    index = call["index"] % x.shape[dim]

    def place(loop: Loop) -> tuple[list[Expr], tuple[Expr, ...]]:
        at = (*loop.idx[:dim], *loop.idx[dim + 1:])
        return [binary(Op.EQ, loop.idx[dim], ix.const(index))], at

    return _view_scatter(ctx, call, place)


@register("aten.diagonal_scatter.default")
def _diagonal_scatter(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    offset = call.args.get("offset", 0)
    d1, d2 = call.args.get("dim1", 0) % x.ndim, call.args.get("dim2", 1) % x.ndim
    row, col = max(0, -offset), max(0, offset)
    length = max(0, min(x.shape[d1] - row, x.shape[d2] - col))

    def place(loop: Loop) -> tuple[list[Expr], tuple[Expr, ...]] | None:
        if length == 0:
            return None
        i, j = loop.idx[d1], loop.idx[d2]
        conds = [binary(Op.EQ, ix.add(j, ix.const(-col)), ix.add(i, ix.const(-row)))]
        conds += _in_range(i, row, row + length, x.shape[d1])
        rest = [loop.idx[k] for k in range(x.ndim) if k not in (d1, d2)]
        return conds, (*rest, ix.add(i, ix.const(-row)))

    return _view_scatter(ctx, call, place)
