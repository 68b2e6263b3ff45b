"""Reductions by index: scatter_reduce and index_reduce with amax, amin, prod and mean, and any
mode without include_self, as masked reductions over the scattered elements; masked_scatter,
whose positions are a prefix count of its mask.

out[.., i, ..] reduces every source element whose index along `dim` is i (and whose other
coordinates are out's), with out's own element joining when include_self holds. A gather of
that kind needs no atomics, which no target has for a product, and gives the same answer on
every run.

Note: the work is out's size times the index's length along dim, against torch's one pass
over the index, so an index longer than BY_INDEX_LIMIT along dim stays with aten. A scatter
that only adds (scatter_add, index_put with accumulate) is kiln's in-place Scatter node.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import reduce

from tasks.ir import index as ix
from tasks.ir.dtypes import DType
from tasks.ir.expr import Expr, Op, binary, cast, const, masked, where
from tasks.ir.nodes import ReduceOp
from tasks.lower.context import Call, Lower
from tasks.lower.reductions import extreme
from tasks.lower.registry import lower_fallback
from tasks.lower.values import Loop, TensorValue
from tasks.lower.views import reshape

BY_INDEX_LIMIT = 4096

_OPS = {"sum": ReduceOp.SUM, "add": ReduceOp.SUM, "mean": ReduceOp.SUM, "prod": ReduceOp.PROD,
        "multiply": ReduceOp.PROD, "amax": ReduceOp.MAX, "amin": ReduceOp.MIN}


@dataclass(frozen=True)
class Contribution:
    """Inside the reduction over r: whether source element r lands on out's element, and it."""

    lands: Callable[[Loop], Expr]
    value: Callable[[Loop], Expr]
    length: int  # how many elements can land on one of out's


def _identity(op: ReduceOp, dtype: DType) -> Expr:
    if op is ReduceOp.MAX:
        return extreme(dtype, top=False)
    if op is ReduceOp.MIN:
        return extreme(dtype, top=True)
    return const(1 if op is ReduceOp.PROD else 0, dtype)


def reduce_by_index(ctx: Lower, call: Call, x: TensorValue, mode: str, include_self: bool,
                    contribution: Contribution) -> TensorValue:
    """x with every element combined (by `mode`) with the source elements that land on it."""
    if mode not in _OPS or contribution.length > BY_INDEX_LIMIT or x.dtype.is_complex:
        fallback: TensorValue = lower_fallback(ctx, call)
        return fallback
    op, compute, shape = _OPS[mode], x.dtype.compute, x.shape

    def total_body(loop: Loop) -> Expr:
        value = cast(contribution.value(loop), compute)
        return where(contribution.lands(loop), value, _identity(op, compute))

    (total,) = ctx.reduction(op, shape, (contribution.length,), call.origin, total_body)
    (count,) = ctx.reduction(ReduceOp.SUM, shape, (contribution.length,), call.origin,
                             lambda loop: cast(contribution.lands(loop), DType.I64))

    def out_body(loop: Loop) -> Expr:
        own = cast(loop.load(x, loop.idx), compute)
        got, n = loop.load(total, loop.idx), loop.load(count, loop.idx)
        if mode == "mean":
            return _mean(own, got, n, include_self)
        combined = _combine(op, own, got) if include_self else got
        return combined if include_self else where(binary(Op.GT, n, ix.const(0)), combined, own)

    return ctx.pointwise(shape, x.dtype, call.origin, out_body)


def _combine(op: ReduceOp, a: Expr, b: Expr) -> Expr:
    return binary({ReduceOp.SUM: Op.ADD, ReduceOp.PROD: Op.MUL, ReduceOp.MAX: Op.MAXIMUM,
                   ReduceOp.MIN: Op.MINIMUM}[op], a, b)


def _mean(own: Expr, total: Expr, n: Expr, include_self: bool) -> Expr:
    """As torch: the sum over the count (own element counted when included; a count of 0 is
    1), floor-divided for integers."""
    if include_self:
        total, n = binary(Op.ADD, own, total), binary(Op.ADD, n, ix.const(1))
    else:
        total = where(binary(Op.GT, n, ix.const(0)), total, own)
        n = binary(Op.MAXIMUM, n, ix.const(1))
    divisor = cast(n, total.dtype)
    if total.dtype.is_float:
        return binary(Op.TRUEDIV, total, divisor)
    return binary(Op.FLOORDIV, total, divisor)


def _all(conds: list[Expr]) -> Expr:
    return reduce(lambda a, b: binary(Op.LOGICAL_AND, a, b), conds)


def scatter_contribution(x: TensorValue, dim: int, index: TensorValue,
                         src: TensorValue | bool | int | float) -> Contribution:
    """scatter's: src[.., r, ..] lands on out[.., index[.., r, ..], ..], the other coordinates
    alike and inside index's shape."""
    def at(loop: Loop) -> tuple[Expr, ...]:
        idx = list(loop.idx)
        idx[dim] = loop.ridx[0]
        return tuple(idx)

    def inside(loop: Loop) -> list[Expr]:
        return [binary(Op.LT, loop.idx[k], ix.const(index.shape[k]))
                for k in range(x.ndim) if k != dim and index.shape[k] < x.shape[k]]

    def lands(loop: Loop) -> Expr:
        target = cast(loop.load(index, at(loop)), DType.I64)
        conds = inside(loop)
        if conds:
            target = masked(_all(conds), target, ix.const(-1))
        return binary(Op.EQ, target, loop.idx[dim])

    def value(loop: Loop) -> Expr:
        if not isinstance(src, TensorValue):
            return const(src, x.dtype)
        element = loop.load(src, at(loop))
        conds = inside(loop)
        return masked(_all(conds), element, const(0, src.dtype)) if conds else element

    return Contribution(lands, value, index.shape[dim] if x.ndim else 1)


def index_contribution(dim: int, index: TensorValue, source: TensorValue) -> Contribution:
    """index_reduce's: source[.., r, ..] lands on out[.., index[r], ..]."""
    def lands(loop: Loop) -> Expr:
        return binary(Op.EQ, cast(loop.load(index, (loop.ridx[0],) if index.ndim else ()), DType.I64),
                      loop.idx[dim])

    def value(loop: Loop) -> Expr:
        idx = list(loop.idx)
        if source.ndim:
            idx[dim] = loop.ridx[0]
        return loop.load(source, tuple(idx))

    return Contribution(lands, value, index.numel)


def masked_scatter(ctx: Lower, call: Call) -> TensorValue:
    """out = self where mask is off; where it is on, source's elements in row-major order: the
    k-th on position takes source's k-th element (k a prefix count of the mask, as a scan)."""
    x, mask, source = call.tensor("self"), call.tensor("mask"), call.tensor("source")
    shape = call.meta.shape
    n = math.prod(shape)
    if n > BY_INDEX_LIMIT or x.dtype.is_complex:
        fallback: TensorValue = lower_fallback(ctx, call)
        return fallback
    on = ctx.pointwise(shape, DType.BOOL, call.origin,
                       lambda loop: cast(loop.broadcast_load(mask), DType.BOOL))
    full = x if x.shape == shape else ctx.pointwise(shape, x.dtype, call.origin,
                                                    lambda loop: loop.broadcast_load(x))
    flat_on, flat_x = reshape(on, (n,)), reshape(full, (n,))
    flat_source = reshape(source, (source.numel,))

    def rank_body(loop: Loop) -> Expr:
        before = binary(Op.LE, loop.ridx[0], loop.idx[0])
        return where(before, cast(loop.load(flat_on, (loop.ridx[0],)), DType.I64), ix.const(0))

    (rank,) = ctx.reduction(ReduceOp.SUM, (n,), (n,), call.origin, rank_body)

    def body(loop: Loop) -> Expr:
        k = ix.add(loop.load(rank, loop.idx), ix.const(-1))
        # an on position's count is >= 1, but the guard says so too: no load can leave source
        inside = binary(Op.LOGICAL_AND, binary(Op.GE, k, ix.const(0)),
                        binary(Op.LT, k, ix.const(source.numel)))
        take = binary(Op.LOGICAL_AND, loop.load(flat_on, loop.idx), inside)
        taken = masked(take, loop.load(flat_source, (k,)), const(0, source.dtype))
        return where(take, cast(taken, flat_x.dtype), loop.load(flat_x, loop.idx))

    return reshape(ctx.pointwise((n,), x.dtype, call.origin, body), shape)
