"""Scans and searches as masked reductions: cumsum, cumprod, logcumsumexp, cummax and cummin
reduce over j <= i of their dim; bucketize and searchsorted count the boundaries below a value.

Note: a scan here is n^2 work per scanned row, against torch's n, but one fused kernel with no
sequential loop: cheap for the lengths models scan (positions from an attention mask), and
fallen back to aten beyond SCAN_LIMIT. A search is a count over the sorted sequence, n work per
value against torch's log n, for the same reason: boundaries are short.
"""

from __future__ import annotations

import math

from tasks.ir import index as ix
from tasks.ir.dtypes import DType
from tasks.ir.expr import Expr, Op, binary, cast, const, unary, where
from tasks.ir.nodes import ReduceOp
from tasks.lower.context import Call, Lower
from tasks.lower.pointwise import common_dtype
from tasks.lower.reductions import extreme, finite_or_zero, pointwise_of, to_dtype
from tasks.lower.registry import lower_fallback, register
from tasks.lower.values import Loop, TensorValue

SCAN_LIMIT = 4096  # longest scanned dim lowered; longer ones are aten fallbacks


def _prefix(x: TensorValue, dim: int, loop: Loop, compute: DType) -> tuple[Expr, Expr]:
    """Inside a scan's reduction over j: whether j <= i along dim, and x at j (in compute type)."""
    j = loop.ridx[0]
    idx = list(loop.idx)
    idx[dim] = j
    return binary(Op.LE, j, loop.idx[dim]), cast(loop.load(x, tuple(idx)), compute)


def _scanned(call: Call) -> tuple[TensorValue, int] | None:
    """The scanned tensor and its dim, or None where aten does the scan (0-d, or too long)."""
    x = call.tensor("self")
    if not x.ndim:
        return None
    dim = call["dim"] % x.ndim
    return (x, dim) if x.shape[dim] <= SCAN_LIMIT else None


@register("aten.cumsum.default", "aten.cumprod.default")
def _scan(ctx: Lower, call: Call) -> TensorValue:
    """out[.., i, ..] = the sum (product) of x[.., j, ..] for j <= i, later elements masked to
    the identity."""
    scanned = _scanned(call)
    if scanned is None:
        x = call.tensor("self")
        if not x.ndim:
            return to_dtype(ctx, x, call.meta.dtype, call.origin)
        fallback: TensorValue = lower_fallback(ctx, call)
        return fallback
    x, dim = scanned
    product = call.target.startswith("aten.cumprod")
    compute = call.meta.dtype.compute

    def body(loop: Loop) -> Expr:
        inside, element = _prefix(x, dim, loop, compute)
        return where(inside, element, const(1 if product else 0, compute))

    (out,) = ctx.reduction(ReduceOp.PROD if product else ReduceOp.SUM, x.shape, (x.shape[dim],),
                           call.origin, body)
    return to_dtype(ctx, out, call.meta.dtype, call.origin)


@register("aten.logcumsumexp.default")
def _logcumsumexp(ctx: Lower, call: Call) -> TensorValue:
    """log of the running sum of exp: each prefix's max, then the shifted sum, as _scan masks."""
    scanned = _scanned(call)
    if scanned is None:
        x = call.tensor("self")
        if not x.ndim:
            return to_dtype(ctx, x, call.meta.dtype, call.origin)
        fallback: TensorValue = lower_fallback(ctx, call)
        return fallback
    x, dim = scanned
    compute, n = call.meta.dtype.compute, x.shape[dim]

    def peak_body(loop: Loop) -> Expr:
        inside, element = _prefix(x, dim, loop, compute)
        return where(inside, element, const(-math.inf, compute))

    (peak,) = ctx.reduction(ReduceOp.MAX, x.shape, (n,), call.origin, peak_body)
    safe = pointwise_of(ctx, peak.shape, peak.dtype, call.origin, [peak], finite_or_zero)

    def total_body(loop: Loop) -> Expr:
        inside, element = _prefix(x, dim, loop, compute)
        shifted = unary(Op.EXP, binary(Op.SUB, element, cast(loop.load(safe, loop.idx), compute)))
        return where(inside, shifted, const(0.0, compute))

    (total,) = ctx.reduction(ReduceOp.SUM, x.shape, (n,), call.origin, total_body)
    return pointwise_of(ctx, x.shape, call.meta.dtype, call.origin, [total, safe],
                        lambda a: binary(Op.ADD, unary(Op.LOG, a[0]), a[1]))


# Note: torch's cummax (cummin) replaces its running value when an element is >= (<=) it or is
# NaN, and never once the running value is NaN. So a prefix's value is its max (NaN if it has
# one), and its index is its last NaN if any, else the last position holding the max: a second
# masked reduction (MAX of the matching positions) finds it.

@register("aten.cummax.default", "aten.cummin.default")
def _cumulative_extreme(ctx: Lower, call: Call) -> tuple[TensorValue, TensorValue]:
    scanned = _scanned(call)
    if scanned is None:
        x = call.tensor("self")
        if not x.ndim:
            zero = ctx.pointwise((), DType.I64, call.origin, lambda _loop: ix.const(0))
            return to_dtype(ctx, x, x.dtype, call.origin), zero
        fallback: tuple[TensorValue, TensorValue] = lower_fallback(ctx, call)
        return fallback
    x, dim = scanned
    top = call.target.startswith("aten.cummax")
    compute, n = x.dtype.compute, x.shape[dim]

    def value_body(loop: Loop) -> Expr:
        inside, element = _prefix(x, dim, loop, compute)
        return where(inside, element, extreme(compute, not top))

    (values,) = ctx.reduction(ReduceOp.MAX if top else ReduceOp.MIN, x.shape, (n,), call.origin, value_body)

    def index_body(loop: Loop) -> Expr:
        inside, element = _prefix(x, dim, loop, compute)
        match = binary(Op.EQ, element, loop.load(values, loop.idx))
        if compute.is_float:
            match = binary(Op.LOGICAL_OR, match, unary(Op.ISNAN, element))
        return where(binary(Op.LOGICAL_AND, inside, match), loop.ridx[0], ix.const(-1))

    (indices,) = ctx.reduction(ReduceOp.MAX, x.shape, (n,), call.origin, index_body)
    return to_dtype(ctx, values, x.dtype, call.origin), indices


# -- searches --------------------------------------------------------------------------------

# Note: torch's binary search moves right past a boundary b while !(b >= v) (left side) or
# !(b > v) (right side), so on a sorted sequence its answer is the count of boundaries that
# pass that test, a NaN value's answer the whole length. A sorter only permutes the sequence,
# which a count does not see. (A sequence holding NaN is not sorted in this sense, and torch's
# answer then depends on where its search happens to look.)

@register("aten.bucketize.Tensor", "aten.bucketize.Scalar")
def _bucketize(ctx: Lower, call: Call) -> TensorValue:
    return _search(ctx, call, call.tensor("boundaries"), call["self"], bool(call["right"]))


@register("aten.searchsorted.Tensor", "aten.searchsorted.Scalar")
def _searchsorted(ctx: Lower, call: Call) -> TensorValue:
    side = call["side"]
    right = side == "right" if side is not None else bool(call["right"])
    return _search(ctx, call, call.tensor("sorted_sequence"), call["self"], right)


def _search(ctx: Lower, call: Call, sequence: TensorValue, value: TensorValue | bool | int | float,
            right: bool) -> TensorValue:
    """For each value, how many boundaries of its row of the sequence lie before it."""
    compute = common_dtype(sequence, value).compute
    shape = call.meta.shape

    def body(loop: Loop) -> Expr:
        r = loop.ridx[0]
        row = loop.idx[:-1] if sequence.ndim > 1 else ()
        boundary = cast(loop.load(sequence, (*row, r)), compute)
        v = cast(loop.load(value, loop.idx), compute) if isinstance(value, TensorValue) \
            else const(value, compute)
        before = unary(Op.LOGICAL_NOT, binary(Op.GT if right else Op.GE, boundary, v))
        return cast(before, DType.I64)

    (count,) = ctx.reduction(ReduceOp.SUM, shape, (sequence.shape[-1],), call.origin, body)
    return to_dtype(ctx, count, call.meta.dtype, call.origin)
