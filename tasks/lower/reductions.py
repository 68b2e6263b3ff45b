"""Reductions, and the composites built on them: mean, var/std, logsumexp, softmax, norms.

A reduction over some dims loops i0.. over the kept dims and r0.. over the reduced ones. It
accumulates in the compute type (fp32 for fp16/bf16) and a pointwise node casts to the output
dtype; keepdim is a view. Composites emit several nodes; the scheduler fuses them again
(layer norm: one welford reduction and its pointwise epilogue, one kernel).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tasks.ir import index as ix
from tasks.ir.dtypes import DType
from tasks.ir.expr import Expr, Op, binary, cast, const, unary, where
from tasks.ir.nodes import ReduceOp
from tasks.lower.context import Call, Lower, LoweringError, OutMeta
from tasks.lower.registry import register
from tasks.lower.values import Loop, TensorValue
from tasks.lower.views import reshape


def extreme(dtype: DType, top: bool) -> Expr:
    """The value above (top) or below every element of dtype: what a masked max or min reads."""
    if dtype.is_float:
        return const(math.inf if top else -math.inf, dtype)
    if dtype is DType.BOOL:
        return const(top, dtype)
    if dtype is DType.U8:
        return const(255 if top else 0, dtype)
    bits = 8 * dtype.itemsize - 1
    return const((1 << bits) - 1 if top else -(1 << bits), dtype)


def norm_dims(dims: Any, ndim: int) -> list[int]:
    if dims is None or (isinstance(dims, list | tuple) and len(dims) == 0):
        return list(range(ndim))
    dims = [dims] if isinstance(dims, int) else list(dims)
    n = max(ndim, 1)
    return sorted({d % n for d in dims}) if ndim else []


def reduce_dims(ctx: Lower, x: TensorValue, dims: list[int], op: ReduceOp, origin: str,
                value: Callable[[Expr, Loop], Expr] | None = None) -> tuple[TensorValue, ...]:
    """Reduce x over dims; `value` maps the loaded element (in compute type) before reducing."""
    kept = [k for k in range(x.ndim) if k not in dims]
    shape = tuple(x.shape[k] for k in kept)
    reduce = tuple(x.shape[k] for k in dims)

    def body(loop: Loop) -> Expr:
        idx: list[Expr] = [ix.const(0)] * x.ndim
        for pos, k in enumerate(kept):
            idx[k] = loop.idx[pos]
        for pos, k in enumerate(dims):
            idx[k] = loop.ridx[pos]
        element = cast(loop.load(x, tuple(idx)), x.dtype.compute)
        return value(element, loop) if value else element

    return ctx.reduction(op, shape, reduce, origin, body)


def keep(x: TensorValue, full: tuple[int, ...], dims: list[int], keepdim: bool) -> TensorValue:
    if not keepdim:
        return x
    return reshape(x, tuple(1 if k in dims else s for k, s in enumerate(full)))


def to_dtype(ctx: Lower, x: TensorValue, dtype: DType, origin: str) -> TensorValue:
    if x.dtype is dtype:
        return x
    return ctx.pointwise(x.shape, dtype, origin, lambda loop: cast(loop.load(x, loop.idx), dtype))


def pointwise_of(ctx: Lower, shape: tuple[int, ...], dtype: DType, origin: str,
                 values: list[TensorValue], fn: Callable[[list[Expr]], Expr]) -> TensorValue:
    """A pointwise node over `shape` combining values loaded broadcast (in compute type)."""
    def body(loop: Loop) -> Expr:
        return fn([cast(loop.broadcast_load(v), v.dtype.compute) for v in values])

    return ctx.pointwise(shape, dtype, origin, body)


_SIMPLE = {"sum": ReduceOp.SUM, "prod": ReduceOp.PROD, "amax": ReduceOp.MAX, "amin": ReduceOp.MIN,
           "any": ReduceOp.ANY, "all": ReduceOp.ALL, "max": ReduceOp.MAX, "min": ReduceOp.MIN}


@register("aten.sum.dim_IntList", "aten.sum.default", "aten.prod.dim_int", "aten.prod.default",
          "aten.amax.default", "aten.amin.default", "aten.any.dim", "aten.any.dims", "aten.any.default",
          "aten.all.dim", "aten.all.dims", "aten.all.default", "aten.max.default", "aten.min.default")
def _simple(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    op = _SIMPLE[call.target.split(".")[1]]
    dims = norm_dims(call.args.get("dim"), x.ndim)
    if call.target in ("aten.any.dims", "aten.all.dims") and call.args.get("dim") == []:
        # Note: unlike sum's, an empty dim list here reduces nothing (torch's any.dims/all.dims).
        return to_dtype(ctx, x, call.meta.dtype, call.origin)
    keepdim = bool(call.args.get("keepdim", False))
    value = None
    if op in (ReduceOp.SUM, ReduceOp.PROD):
        acc = call.meta.dtype.compute
        if x.dtype is DType.BOOL or acc.is_int:
            value = _as(acc)
    (out,) = reduce_dims(ctx, x, dims, op, call.origin, value)
    out = to_dtype(ctx, out, call.meta.dtype, call.origin)
    return keep(out, x.shape, dims, keepdim)


def _as(dtype: DType) -> Callable[[Expr, Loop], Expr]:
    return lambda e, _loop: cast(e, dtype)


@register("aten.max.dim", "aten.min.dim")
def _max_dim(ctx: Lower, call: Call) -> tuple[TensorValue, TensorValue]:
    x = call.tensor("self")
    dims = norm_dims(call["dim"], x.ndim)
    is_max = call.target.split(".")[1] == "max"
    (values,) = reduce_dims(ctx, x, dims, ReduceOp.MAX if is_max else ReduceOp.MIN, call.origin)
    as_int = _as(DType.I64) if x.dtype is DType.BOOL else None  # argmax of bools: of 0s and 1s
    (indices,) = reduce_dims(ctx, x, dims, ReduceOp.ARGMAX if is_max else ReduceOp.ARGMIN, call.origin,
                             as_int)
    values = to_dtype(ctx, values, x.dtype, call.origin)
    return (keep(values, x.shape, dims, call["keepdim"]), keep(indices, x.shape, dims, call["keepdim"]))


@register("aten.argmax.default", "aten.argmin.default")
def _argmax(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    op = ReduceOp.ARGMAX if call.target.split(".")[1] == "argmax" else ReduceOp.ARGMIN
    if call["dim"] is None:
        flat = reshape(x, (x.numel,))
        (out,) = reduce_dims(ctx, flat, [0], op, call.origin)
        return reshape(out, call.meta.shape)
    dims = norm_dims(call["dim"], x.ndim)
    (out,) = reduce_dims(ctx, x, dims, op, call.origin)
    return keep(out, x.shape, dims, call["keepdim"])


def _count(x: TensorValue, dims: list[int]) -> int:
    n = 1
    for d in dims:
        n *= x.shape[d]
    return n


@register("aten.mean.dim", "aten.mean.default")
def _mean(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    dims = norm_dims(call.args.get("dim"), x.ndim)
    acc = call.meta.dtype.compute
    (total,) = reduce_dims(ctx, x, dims, ReduceOp.SUM, call.origin, _as(acc))
    n = _count(x, dims)
    out = pointwise_of(ctx, total.shape, call.meta.dtype, call.origin, [total],
                       lambda a: binary(Op.TRUEDIV, a[0], const(n, a[0].dtype)))
    return keep(out, x.shape, dims, bool(call.args.get("keepdim", False)))


def _correction(call: Call) -> float:
    if "correction" in call.args and call["correction"] is not None:
        return float(call["correction"])
    return 1.0 if call.args.get("unbiased", True) else 0.0


def variance(ctx: Lower, call: Call) -> tuple[TensorValue, TensorValue, list[int]]:
    """(mean, var) of self over the call's dims, in the compute type, without keepdim."""
    x = call.tensor("self")
    dims = norm_dims(call.args.get("dim"), x.ndim)
    mean, m2 = reduce_dims(ctx, x, dims, ReduceOp.WELFORD, call.origin)
    if _count(x, dims) == 0:  # the mean of nothing is NaN, as eager's sum / 0 (welford's is 0)
        mean = pointwise_of(ctx, mean.shape, mean.dtype, call.origin, [mean],
                            lambda a: const(math.nan, a[0].dtype))
    denominator = max(_count(x, dims) - _correction(call), 0.0)
    var = pointwise_of(ctx, m2.shape, m2.dtype, call.origin, [m2],
                       lambda a: binary(Op.TRUEDIV, a[0], const(denominator, a[0].dtype)))
    return mean, var, dims


@register("aten.var.correction", "aten.var.dim", "aten.var.default", "aten.std.correction",
          "aten.std.dim", "aten.std.default")
def _var(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    _, var, dims = variance(ctx, call)
    root = call.target.split(".")[1] == "std"
    out = pointwise_of(ctx, var.shape, call.meta.dtype, call.origin, [var],
                       lambda a: unary(Op.SQRT, a[0]) if root else a[0])
    return keep(out, x.shape, dims, bool(call.args.get("keepdim", False)))


@register("aten.var_mean.correction", "aten.var_mean.dim", "aten.std_mean.correction")
def _var_mean(ctx: Lower, call: Call) -> tuple[TensorValue, TensorValue]:
    x = call.tensor("self")
    mean, var, dims = variance(ctx, call)
    root = call.target.split(".")[1] == "std_mean"
    metas = call.out if isinstance(call.out, tuple) else ()
    dtype = metas[0].dtype if metas and metas[0] else x.dtype
    var = pointwise_of(ctx, var.shape, dtype, call.origin, [var],
                       lambda a: unary(Op.SQRT, a[0]) if root else a[0])
    keepdim = bool(call.args.get("keepdim", False))
    mean = to_dtype(ctx, mean, dtype, call.origin)
    return keep(var, x.shape, dims, keepdim), keep(mean, x.shape, dims, keepdim)


@register("aten.logsumexp.default")
def _logsumexp(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    if not x.dtype.is_float:  # integers promote to the default float, as eager does
        x = to_dtype(ctx, x, call.meta.dtype, call.origin)
    dims = norm_dims(call["dim"], x.ndim)
    (peak,) = reduce_dims(ctx, x, dims, ReduceOp.MAX, call.origin)
    safe = pointwise_of(ctx, peak.shape, peak.dtype, call.origin, [peak], finite_or_zero)
    shift = keep(safe, x.shape, dims, True)
    (total,) = reduce_dims(ctx, x, dims, ReduceOp.SUM, call.origin,
                           lambda e, loop: unary(Op.EXP, binary(Op.SUB, e, _at_row(loop, shift, dims))))
    out = pointwise_of(ctx, total.shape, call.meta.dtype, call.origin, [total, safe],
                       lambda a: binary(Op.ADD, unary(Op.LOG, a[0]), a[1]))
    return keep(out, x.shape, dims, call["keepdim"])


def finite_or_zero(a: list[Expr]) -> Expr:
    return where(unary(Op.ISINF, a[0]), const(0.0, a[0].dtype), a[0])


def _at_row(loop: Loop, row: TensorValue, dims: list[int]) -> Expr:
    """A keepdim row value read inside a reduction loop (kept dims i.., reduced dims at 0)."""
    idx: list[Expr] = []
    kept = iter(loop.idx)
    for k in range(row.ndim):
        idx.append(ix.const(0) if k in dims else next(kept))
    return cast(loop.load(row, tuple(idx)), row.dtype.compute)


@register("aten._softmax.default", "aten._log_softmax.default", "aten.softmax.int",
          "aten.log_softmax.int")
def _softmax(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    dims = norm_dims(call["dim"], x.ndim)
    log = "log_softmax" in call.target
    (peak,) = reduce_dims(ctx, x, dims, ReduceOp.MAX, call.origin)
    peak_row = keep(peak, x.shape, dims, True)
    (total,) = reduce_dims(ctx, x, dims, ReduceOp.SUM, call.origin,
                           lambda e, loop: unary(Op.EXP, binary(Op.SUB, e, _at_row(loop, peak_row, dims))))
    total_row = keep(total, x.shape, dims, True)

    def out(a: list[Expr]) -> Expr:
        shifted = binary(Op.SUB, cast(a[0], a[1].dtype), a[1])
        if log:
            return binary(Op.SUB, shifted, unary(Op.LOG, a[2]))
        return binary(Op.TRUEDIV, unary(Op.EXP, shifted), a[2])

    return pointwise_of(ctx, x.shape, call.meta.dtype, call.origin, [x, peak_row, total_row], out)


def _affine(a: list[Expr], has_weight: bool, has_bias: bool) -> Expr:
    """a[0] * a[1] (weight) + a[2] (bias), with either absent."""
    y, rest = a[0], iter(a[1:])
    if has_weight:
        y = binary(Op.MUL, y, next(rest))
    if has_bias:
        y = binary(Op.ADD, y, next(rest))
    return y


def _present(*values: Any) -> list[TensorValue]:
    return [v for v in values if isinstance(v, TensorValue)]


def _rstd(m2: Expr, count: int, eps: float) -> Expr:
    var = binary(Op.TRUEDIV, m2, const(count, m2.dtype))
    return unary(Op.RSQRT, binary(Op.ADD, var, const(eps, m2.dtype)))


@register("aten.native_layer_norm.default")
def _layer_norm(ctx: Lower, call: Call) -> tuple[TensorValue, TensorValue, TensorValue]:
    x, weight, bias = call.tensor("input"), call["weight"], call["bias"]
    n_norm = len(call["normalized_shape"])
    dims = list(range(x.ndim - n_norm, x.ndim))
    mean, m2 = reduce_dims(ctx, x, dims, ReduceOp.WELFORD, call.origin)
    count, eps = _count(x, dims), call["eps"]
    rstd = pointwise_of(ctx, m2.shape, m2.dtype, call.origin, [m2], lambda a: _rstd(a[0], count, eps))
    mean_row, rstd_row = keep(mean, x.shape, dims, True), keep(rstd, x.shape, dims, True)
    metas = call.out if isinstance(call.out, tuple) else ()
    params = _present(weight, bias)
    out = pointwise_of(ctx, x.shape, x.dtype, call.origin, [x, mean_row, rstd_row, *params],
                       lambda a: _affine([binary(Op.MUL, binary(Op.SUB, a[0], a[1]), a[2]), *a[3:]],
                                         weight is not None, bias is not None))
    stat_dtype = metas[1].dtype if len(metas) > 1 and metas[1] else mean.dtype
    return (out, to_dtype(ctx, mean_row, stat_dtype, call.origin),
            to_dtype(ctx, rstd_row, stat_dtype, call.origin))


@register("aten._native_batch_norm_legit_no_training.default")
def _batch_norm(ctx: Lower, call: Call) -> tuple[TensorValue, ...]:
    x, weight, bias = call.tensor("input"), call["weight"], call["bias"]
    mean, var, eps = call.tensor("running_mean"), call.tensor("running_var"), call["eps"]
    channel_shape = (x.shape[1],) + (1,) * (x.ndim - 2)
    per_channel = [reshape(v, channel_shape) for v in _present(mean, var, weight, bias)]

    def out(a: list[Expr]) -> Expr:
        inv = unary(Op.RSQRT, binary(Op.ADD, a[2], const(eps, a[2].dtype)))
        return _affine([binary(Op.MUL, binary(Op.SUB, a[0], a[1]), inv), *a[3:]],
                       weight is not None, bias is not None)

    y = pointwise_of(ctx, x.shape, x.dtype, call.origin, [x, *per_channel], out)
    return (y, *_batch_norm_saved(ctx, call, mean, var))


def _batch_norm_saved(ctx: Lower, call: Call, mean: TensorValue, var: TensorValue) -> list[TensorValue]:
    """The saved statistics eval-mode batch norm returns besides its output.

    Note: torch's kernels differ here, and the export records which one ran: on CPU they are
    empty, on CUDA the running mean and 1/sqrt(running var + eps), per channel. Each is made as
    its meta says (what a later node, or the graph's output, may read)."""
    metas = call.out if isinstance(call.out, tuple) else ()
    eps = call["eps"]
    saved = []
    for i, stat in ((1, mean), (2, var)):
        meta = metas[i] if i < len(metas) else None
        if meta is None or meta.shape != stat.shape:
            saved.append(_empty(ctx, meta.dtype if meta is not None else stat.dtype, call.origin))
            continue
        stat = to_dtype(ctx, stat, meta.dtype, call.origin)  # torch computes in the stats' dtype
        if i == 2:
            stat = pointwise_of(ctx, stat.shape, stat.dtype, call.origin, [stat],
                                lambda a: unary(Op.RSQRT, binary(Op.ADD, a[0], const(eps, a[0].dtype))))
        saved.append(stat)
    return saved


# -- batch norm in training mode: the batch's statistics, and the running ones updated --------

@register("aten._native_batch_norm_legit_functional.default", "aten._native_batch_norm_legit.no_stats",
          "aten._batch_norm_with_update_functional.default")
def _batch_norm_training(ctx: Lower, call: Call) -> tuple[TensorValue, ...]:
    """out, the batch's mean and 1/sqrt(var + eps) per channel, then (where the op has running
    stats) anything between and the running mean and variance moved toward the batch's by
    momentum, the variance unbiased, as torch's kernels compute them."""
    x, weight, bias, eps = call.tensor("input"), call["weight"], call["bias"], call["eps"]
    running = call.args.get("running_mean"), call.args.get("running_var")
    metas = call.out if isinstance(call.out, tuple) else ()
    if call.args.get("training", True) is False:  # the running stats, left as they are
        kept = [call.tensor("running_mean"), call.tensor("running_var")] if len(metas) == 5 else []
        return (*_batch_norm(ctx, call), *kept)
    dims = [d for d in range(x.ndim) if d != 1]
    mean, m2 = reduce_dims(ctx, x, dims, ReduceOp.WELFORD, call.origin)
    count = _count(x, dims)
    rstd = pointwise_of(ctx, m2.shape, m2.dtype, call.origin, [m2], lambda a: _rstd(a[0], count, eps))
    channel = (x.shape[1],) + (1,) * (x.ndim - 2)
    per_channel = [reshape(v, channel) for v in (mean, rstd, *_present(weight, bias))]
    out = pointwise_of(ctx, x.shape, x.dtype, call.origin, [x, *per_channel],
                       lambda a: _affine([binary(Op.MUL, binary(Op.SUB, a[0], a[1]), a[2]), *a[3:]],
                                         weight is not None, bias is not None))
    stat = metas[1].dtype if len(metas) > 1 and metas[1] is not None else mean.dtype
    results = [out, to_dtype(ctx, mean, stat, call.origin), to_dtype(ctx, rstd, stat, call.origin)]
    if running[0] is None:
        return tuple(results)
    for meta in metas[3:-2]:  # _batch_norm_with_update's reserve (empty on CPU and CUDA)
        assert meta is not None
        results.append(_zeros_like_meta(ctx, meta, call.origin))
    momentum = call["momentum"]
    unbiased = count / (count - 1) if count > 1 else math.inf

    def moved(old: TensorValue, batch: TensorValue, scale: float) -> TensorValue:
        def body(a: list[Expr]) -> Expr:
            kept = binary(Op.MUL, cast(a[0], a[1].dtype), const(1 - momentum, a[1].dtype))
            return binary(Op.ADD, kept, binary(Op.MUL, a[1], const(momentum * scale, a[1].dtype)))

        return pointwise_of(ctx, old.shape, old.dtype, call.origin, [old, batch], body)

    var = pointwise_of(ctx, m2.shape, m2.dtype, call.origin, [m2],
                       lambda a: binary(Op.TRUEDIV, a[0], const(count, a[0].dtype)))
    running_mean, running_var = call.tensor("running_mean"), call.tensor("running_var")
    return (*results, moved(running_mean, mean, 1.0), moved(running_var, var, unbiased))


def _zeros_like_meta(ctx: Lower, meta: OutMeta, origin: str) -> TensorValue:
    return ctx.pointwise(meta.shape, meta.dtype, origin, lambda loop: const(0, meta.dtype))


def _empty(ctx: Lower, dtype: DType, origin: str) -> TensorValue:
    return ctx.pointwise((0,), dtype, origin, lambda loop: const(0, dtype))


@register("aten.native_group_norm.default")
def _group_norm(ctx: Lower, call: Call) -> tuple[TensorValue, TensorValue, TensorValue]:
    x, weight, bias = call.tensor("input"), call["weight"], call["bias"]
    n, c, groups, eps = call["N"], call["C"], call["group"], call["eps"]
    grouped = reshape(x, (n, groups, x.numel // (n * groups)))
    mean, m2 = reduce_dims(ctx, grouped, [2], ReduceOp.WELFORD, call.origin)
    count = grouped.shape[2]
    rstd = pointwise_of(ctx, m2.shape, m2.dtype, call.origin, [m2], lambda a: _rstd(a[0], count, eps))
    spatial = (1,) * (x.ndim - 2)
    per_group = (n, groups, 1, *spatial)
    split = (n, groups, c // groups, *x.shape[2:])
    xs = reshape(x, split)
    mean_b, rstd_b = reshape(mean, per_group), reshape(rstd, per_group)
    params = [reshape(v, (1, groups, c // groups, *spatial)) for v in _present(weight, bias)]
    y = pointwise_of(ctx, split, x.dtype, call.origin, [xs, mean_b, rstd_b, *params],
                     lambda a: _affine([binary(Op.MUL, binary(Op.SUB, a[0], a[1]), a[2]), *a[3:]],
                                       weight is not None, bias is not None))
    stats = (to_dtype(ctx, mean, x.dtype, call.origin), to_dtype(ctx, rstd, x.dtype, call.origin))
    return reshape(y, x.shape), *stats


@register("aten.native_dropout.default", "aten.dropout.default")
def _dropout(ctx: Lower, call: Call) -> Any:
    x = call.tensor("input")
    if call["train"] and call["p"] > 0:
        raise LoweringError("dropout in training mode; kiln compiles inference: call model.eval()")
    if call.target == "aten.dropout.default":
        return x
    mask = ctx.pointwise(x.shape, DType.BOOL, call.origin, lambda loop: const(True, DType.BOOL))
    return x, mask
