"""Vector norms as reductions: linalg_vector_norm (what torch.norm, F.normalize and
linalg.norm of a vector become), dist, and cdist's pairwise distances.

Note: their order `ord` is a Scalar, which the aten fallback cannot pass (torch's stable
dispatcher converts none), and a norm is a reduction kiln fuses anyway.
"""

from __future__ import annotations

import math

from tasks.ir.expr import Expr, Op, binary, cast, const, unary
from tasks.ir.nodes import ReduceOp
from tasks.lower.context import Call, Lower
from tasks.lower.reductions import keep, norm_dims, pointwise_of, reduce_dims, to_dtype
from tasks.lower.registry import register
from tasks.lower.values import Loop, TensorValue, broadcast_index


@register("aten.linalg_vector_norm.default")
def _vector_norm(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    if call["dtype"] is not None:  # computed in the dtype asked for, which the output has
        x = to_dtype(ctx, x, call.meta.dtype, call.origin)
    dims = norm_dims(call["dim"], x.ndim)
    return vector_norm(ctx, x, float(call["ord"]), dims, bool(call["keepdim"]), call)


@register("aten.dist.default")
def _dist(ctx: Lower, call: Call) -> TensorValue:
    a, b = call.tensor("self"), call.tensor("other")
    shape = _broadcast(a.shape, b.shape)
    diff = pointwise_of(ctx, shape, call.meta.dtype, call.origin, [a, b],
                        lambda v: binary(Op.SUB, v[0], v[1]))
    return vector_norm(ctx, diff, float(call["p"]), list(range(len(shape))), False, call)


@register("aten._cdist_forward.default")
def _cdist(ctx: Lower, call: Call) -> TensorValue:
    """out[.., i, j] = the p-norm of x1[.., i, :] - x2[.., j, :], batch dims broadcast.

    Note: for p = 2 and more than 25 rows, torch computes this through a matmul
    (|a|^2 + |b|^2 - 2ab, clamped); the direct sum of squares here is the more accurate of
    the two, and within torch's own tolerance of it."""
    a, b = call.tensor("x1"), call.tensor("x2")
    order, shape = float(call["p"]), call.meta.shape
    acc = call.meta.dtype.compute

    def body(loop: Loop) -> Expr:
        *batch, i, j = loop.idx
        r = loop.ridx[0]
        left = loop.load(a, (*broadcast_index(a.shape[:-2], shape[:-2], tuple(batch)), i, r))
        right = loop.load(b, (*broadcast_index(b.shape[:-2], shape[:-2], tuple(batch)), j, r))
        diff = binary(Op.SUB, cast(left, acc), cast(right, acc))
        if order == 0.0:  # as torch's cdist: min(ceil(|d|), 1), which keeps a NaN
            return binary(Op.MINIMUM, unary(Op.CEIL, unary(Op.ABS, diff)), const(1.0, acc))
        return unary(Op.ABS, diff) if math.isinf(order) else _term(diff, order)

    op = ReduceOp.MAX if math.isinf(order) else ReduceOp.SUM
    (out,) = ctx.reduction(op, shape, (a.shape[-1],), call.origin, body)
    if not math.isinf(order) and order not in (0.0, 1.0):
        out = pointwise_of(ctx, out.shape, out.dtype, call.origin, [out], lambda v: _root(v[0], order))
    return to_dtype(ctx, out, call.meta.dtype, call.origin)


def vector_norm(ctx: Lower, x: TensorValue, order: float, dims: list[int], keepdim: bool,
                call: Call) -> TensorValue:
    """(sum |x|^p)^(1/p) over dims; max |x| for inf, min |x| for -inf, the count of nonzeros for 0."""
    if math.isinf(order):
        (out,) = reduce_dims(ctx, x, dims, ReduceOp.MAX if order > 0 else ReduceOp.MIN, call.origin,
                             lambda e, _loop: unary(Op.ABS, e))
    else:
        (out,) = reduce_dims(ctx, x, dims, ReduceOp.SUM, call.origin, lambda e, _loop: _term(e, order))
        if order not in (0.0, 1.0):
            out = pointwise_of(ctx, out.shape, out.dtype, call.origin, [out], lambda v: _root(v[0], order))
    out = to_dtype(ctx, out, call.meta.dtype, call.origin)
    return keep(out, x.shape, dims, keepdim)


def _term(e: Expr, order: float) -> Expr:
    if order == 0.0:
        return cast(binary(Op.NE, e, const(0, e.dtype)), e.dtype)
    magnitude = unary(Op.ABS, e)
    if order == 1.0:
        return magnitude
    if order == 2.0:
        return binary(Op.MUL, magnitude, magnitude)
    return binary(Op.POW, magnitude, const(order, e.dtype))


def _root(total: Expr, order: float) -> Expr:
    if order == 2.0:
        return unary(Op.SQRT, total)
    return binary(Op.POW, total, const(1.0 / order, total.dtype))


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    return tuple(max(x, y) if min(x, y) != 0 else 0 for x, y in zip(a, b, strict=True))
