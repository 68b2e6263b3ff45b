"""Elementwise lowerings: math, comparisons, logic, bits, casts, where, clamp and activations.

Every one is a `map_pointwise`: operands are loaded broadcast to the output shape, cast to the
compute type (fp16/bf16 compute in fp32, as eager does inside each op), combined, and cast to
the output's dtype when stored.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from tasks.ir.dtypes import DType
from tasks.ir.expr import FLOAT_ONLY, Expr, Op, binary, cast, const, unary, where
from tasks.lower.context import Call, Lower
from tasks.lower.registry import register
from tasks.lower.values import TensorValue

Operand = TensorValue | bool | int | float
Combine = Callable[[list[Expr]], Expr]


def _meta_arg(value: Operand) -> Any:
    if isinstance(value, TensorValue):
        from tasks.ir.interpret import torch_dtype

        return torch.empty(value.shape, dtype=torch_dtype(value.dtype), device="meta")
    return value


def common_dtype(*operands: Operand) -> DType:
    """torch's type promotion over tensors and Python scalars (as torch._refs computes it)."""
    from tasks.lower.program import dtype_of

    metas = [_meta_arg(v) for v in operands]
    _, result = elementwise_dtypes(*metas, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
    return dtype_of(result)


def operand(v: Operand, loop_load: Callable[[TensorValue], Expr], dtype: DType,
            storage: DType | None = None) -> Expr:
    """A tensor loaded, or a Python scalar as `storage` holds it, in the compute type `dtype`."""
    if isinstance(v, TensorValue):
        return cast(loop_load(v), dtype)
    return const(stored(v, storage or dtype), dtype)


# Note: eager casts a Python scalar operand to the op's common dtype before computing, so with
# fp16/bf16 tensors `x == 0.1` compares against fp16(0.1), and `x % 0.1` divides by it. Only
# the value is rounded here; the arithmetic still runs in fp32. (CPU mul and div keep such a
# scalar at full precision; rounding it moves their results by an ulp at most.)
def stored(value: bool | int | float, dtype: DType) -> bool | int | float:
    """value rounded to dtype where dtype stores less than it computes with (fp16, bf16)."""
    if isinstance(value, bool) or not dtype.is_float or dtype.compute is dtype:
        return value
    from tasks.ir.interpret import torch_dtype

    return float(torch.tensor(value, dtype=torch_dtype(dtype)))


def map_pointwise(ctx: Lower, call: Call, operands: list[Operand], combine: Combine,
                  compute: DType | None = None) -> TensorValue:
    meta = call.meta
    common = compute or common_dtype(*operands)

    def body(loop: Any) -> Expr:
        return combine([operand(v, loop.broadcast_load, common.compute, common) for v in operands])

    return ctx.pointwise(meta.shape, meta.dtype, call.origin, body)


def _float_compute(call: Call, operands: list[Operand]) -> DType:
    common = common_dtype(*operands)
    return common if common.is_float else call.meta.dtype


# -- unary -----------------------------------------------------------------------------------

_UNARY = {
    "abs": Op.ABS, "neg": Op.NEG, "exp": Op.EXP, "exp2": Op.EXP2, "expm1": Op.EXPM1, "log": Op.LOG,
    "log2": Op.LOG2, "log10": Op.LOG10, "log1p": Op.LOG1P, "sqrt": Op.SQRT, "rsqrt": Op.RSQRT,
    "reciprocal": Op.RECIPROCAL, "sin": Op.SIN, "cos": Op.COS, "tan": Op.TAN, "asin": Op.ASIN,
    "acos": Op.ACOS, "atan": Op.ATAN, "sinh": Op.SINH, "cosh": Op.COSH, "tanh": Op.TANH,
    "asinh": Op.ASINH, "acosh": Op.ACOSH, "atanh": Op.ATANH, "erf": Op.ERF, "erfinv": Op.ERFINV,
    "sigmoid": Op.SIGMOID, "floor": Op.FLOOR, "ceil": Op.CEIL, "round": Op.ROUND, "trunc": Op.TRUNC,
    "sign": Op.SIGN, "isnan": Op.ISNAN, "isinf": Op.ISINF, "logical_not": Op.LOGICAL_NOT,
    "bitwise_not": Op.BITWISE_NOT,
}
_INT_IDENTITY = {Op.FLOOR, Op.CEIL, Op.ROUND, Op.TRUNC}


def _unary(op: Op) -> Callable[[Lower, Call], TensorValue]:
    def lower(ctx: Lower, call: Call) -> TensorValue:
        x = call.tensor("self")
        compute = _float_compute(call, [x]) if op in FLOAT_ONLY else x.dtype
        return map_pointwise(ctx, call, [x], lambda a: apply_unary(op, a[0]), compute)

    return lower


def apply_unary(op: Op, x: Expr) -> Expr:
    if x.dtype is DType.BOOL and op is Op.BITWISE_NOT:
        return unary(Op.LOGICAL_NOT, x)
    if not x.dtype.is_float:
        if op in _INT_IDENTITY or (op is Op.ABS and x.dtype is DType.BOOL):
            return x
        if op in (Op.ISNAN, Op.ISINF):
            return const(False, DType.BOOL)
        if op is Op.SIGN and x.dtype is DType.BOOL:
            return x
    return unary(op, x)


for _name, _op in _UNARY.items():
    register(f"aten.{_name}.default")(_unary(_op))


@register("aten.relu.default")
def _relu(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    return map_pointwise(ctx, call, [x], lambda a: binary(Op.MAXIMUM, a[0], const(0, a[0].dtype)))


# -- binary ----------------------------------------------------------------------------------

# Note: each op lists its tensor overloads. "mul.default", "eq.default" and the like exist, but
# they are Python-number ops (Scalar a, Scalar b), not tensor ops; maximum, atan2 and the
# logical ops have only "default"; the shifts take a Scalar as "Tensor_Scalar".
_PAIR = ("Tensor", "Scalar")
_BINARY = {
    "mul": (Op.MUL, _PAIR), "maximum": (Op.MAXIMUM, ("default",)),
    "minimum": (Op.MINIMUM, ("default",)), "atan2": (Op.ATAN2, ("default",)),
    "fmod": (Op.FMOD, _PAIR), "remainder": (Op.MOD, _PAIR), "bitwise_and": (Op.BITWISE_AND, _PAIR),
    "bitwise_or": (Op.BITWISE_OR, _PAIR), "bitwise_xor": (Op.BITWISE_XOR, _PAIR),
    "bitwise_left_shift": (Op.LSHIFT, ("Tensor", "Tensor_Scalar")),
    "bitwise_right_shift": (Op.RSHIFT, ("Tensor", "Tensor_Scalar")),
    "logical_and": (Op.LOGICAL_AND, ("default",)), "logical_or": (Op.LOGICAL_OR, ("default",)),
    "logical_xor": (Op.LOGICAL_XOR, ("default",)), "eq": (Op.EQ, _PAIR), "ne": (Op.NE, _PAIR),
    "lt": (Op.LT, _PAIR), "le": (Op.LE, _PAIR), "gt": (Op.GT, _PAIR), "ge": (Op.GE, _PAIR),
}
_BOOL_BITS = {Op.BITWISE_AND: Op.LOGICAL_AND, Op.BITWISE_OR: Op.LOGICAL_OR,
              Op.BITWISE_XOR: Op.LOGICAL_XOR}


def apply_binary(op: Op, a: Expr, b: Expr) -> Expr:
    if a.dtype is DType.BOOL and op in _BOOL_BITS:
        return binary(_BOOL_BITS[op], a, b)
    if a.dtype is DType.BOOL and op in (Op.MAXIMUM, Op.MUL):
        return binary(Op.LOGICAL_OR if op is Op.MAXIMUM else Op.LOGICAL_AND, a, b)
    if a.dtype is DType.BOOL and op is Op.MINIMUM:
        return binary(Op.LOGICAL_AND, a, b)
    if op is Op.MOD and a.dtype.is_float:
        return float_remainder(a, b)
    return binary(op, a, b)


def float_remainder(a: Expr, b: Expr) -> Expr:
    """torch.remainder on floats (c10's remainder): fmod, moved by b where the signs differ."""
    zero = const(0.0, a.dtype)
    rem = binary(Op.FMOD, a, b)
    differ = binary(Op.NE, binary(Op.LT, b, zero), binary(Op.LT, rem, zero))
    return where(binary(Op.LOGICAL_AND, binary(Op.NE, rem, zero), differ), binary(Op.ADD, rem, b), rem)


def _binary(op: Op) -> Callable[[Lower, Call], TensorValue]:
    def lower(ctx: Lower, call: Call) -> TensorValue:
        operands = [call["self"], call["other"]]
        compute = _float_compute(call, operands) if op in FLOAT_ONLY else None
        return map_pointwise(ctx, call, operands, lambda a: apply_binary(op, a[0], a[1]), compute)

    return lower


for _name, (_op, _overloads) in _BINARY.items():
    for _overload in _overloads:
        register(f"aten.{_name}.{_overload}")(_binary(_op))


def _scaled(x: Expr, alpha: Any) -> Expr:
    return x if alpha in (None, 1) else binary(Op.MUL, x, const(alpha, x.dtype))


def _add_sub(op: Op, reverse: bool = False) -> Callable[[Lower, Call], TensorValue]:
    def lower(ctx: Lower, call: Call) -> TensorValue:
        alpha = call.args.get("alpha", 1)

        def combine(a: list[Expr]) -> Expr:
            x, y = (a[1], a[0]) if reverse else (a[0], a[1])
            if x.dtype is DType.BOOL:
                return binary(Op.LOGICAL_OR, x, y)
            return binary(op, x, _scaled(y, alpha))

        return map_pointwise(ctx, call, [call["self"], call["other"]], combine)

    return lower


for _overload in ("Tensor", "Scalar"):
    register(f"aten.add.{_overload}")(_add_sub(Op.ADD))
    register(f"aten.sub.{_overload}")(_add_sub(Op.SUB))
    register(f"aten.rsub.{_overload}")(_add_sub(Op.SUB, reverse=True))


@register("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode", "aten.div.Scalar_mode",
          "aten.floor_divide.default", "aten.floor_divide.Scalar")
def _div(ctx: Lower, call: Call) -> TensorValue:
    mode = call.args.get("rounding_mode", "floor" if "floor_divide" in call.target else None)
    operands = [call["self"], call["other"]]
    if mode is None:
        compute = _float_compute(call, operands)
        return map_pointwise(ctx, call, operands, lambda a: binary(Op.TRUEDIV, a[0], a[1]), compute)
    return map_pointwise(ctx, call, operands, lambda a: rounded_div(a[0], a[1], mode))


def rounded_div(a: Expr, b: Expr, mode: str) -> Expr:
    if a.dtype.is_float:
        if mode == "floor":
            return float_floor_div(a, b)
        return unary(Op.TRUNC, binary(Op.TRUEDIV, a, b))
    q = binary(Op.FLOORDIV, a, b)
    if mode == "floor":
        return q
    # Note: integers have floor division only; trunc rounds up where the signs differ and b
    # does not divide a exactly.
    zero = const(0, a.dtype)
    inexact = binary(Op.NE, binary(Op.MOD, a, b), zero)
    signs = binary(Op.NE, binary(Op.LT, a, zero), binary(Op.LT, b, zero))
    return where(binary(Op.LOGICAL_AND, inexact, signs), binary(Op.ADD, q, const(1, a.dtype)), q)


def float_floor_div(a: Expr, b: Expr) -> Expr:
    """Python's float floor division, as torch computes it (c10 div_floor_floating).

    Note: floor(a / b) is off by one where a / b rounds up onto an integer: 1.0 // 0.1 is 9.0,
    while floor(1.0 / 0.1) is 10.0. torch divides the exact difference a - fmod(a, b) instead.
    """
    def c(value: float) -> Expr:
        return const(value, a.dtype)

    quotient = binary(Op.TRUEDIV, a, b)
    rem = binary(Op.FMOD, a, b)
    div = binary(Op.TRUEDIV, binary(Op.SUB, a, rem), b)
    opposite = binary(Op.NE, binary(Op.LT, b, c(0.0)), binary(Op.LT, rem, c(0.0)))
    inexact = binary(Op.LOGICAL_AND, binary(Op.NE, rem, c(0.0)), opposite)
    div = where(inexact, binary(Op.SUB, div, c(1.0)), div)
    floor = unary(Op.FLOOR, div)
    floor = where(binary(Op.GT, binary(Op.SUB, div, floor), c(0.5)), binary(Op.ADD, floor, c(1.0)), floor)
    signed_zero = binary(Op.MUL, quotient, c(0.0))
    result = where(binary(Op.NE, div, c(0.0)), floor, signed_zero)
    return where(binary(Op.EQ, b, c(0.0)), quotient, result)


@register("aten.pow.Tensor_Tensor", "aten.pow.Tensor_Scalar", "aten.pow.Scalar")
def _pow(ctx: Lower, call: Call) -> TensorValue:
    base, exponent = call["self"], call["exponent"]
    return map_pointwise(ctx, call, [base, exponent], lambda a: power(a[0], a[1], exponent))


def power(x: Expr, y: Expr, exponent: Any) -> Expr:
    if isinstance(exponent, int | float) and not isinstance(exponent, bool):
        if exponent == 1:
            return x
        if exponent == 2:
            return binary(Op.MUL, x, x)
        if exponent == 3:
            return binary(Op.MUL, binary(Op.MUL, x, x), x)
        if exponent == 0.5 and x.dtype.is_float:
            return unary(Op.SQRT, x)
        if exponent == -1 and x.dtype.is_float:
            return unary(Op.RECIPROCAL, x)
    return binary(Op.POW, x, y)


# -- where, clamp, fills, casts -------------------------------------------------------------

@register("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def _where(ctx: Lower, call: Call) -> TensorValue:
    cond, a, b = call["condition"], call["self"], call["other"]
    dtype = common_dtype(a, b).compute

    def body(loop: Any) -> Expr:
        c = operand(cond, loop.broadcast_load, DType.BOOL)
        return where(c, operand(a, loop.broadcast_load, dtype), operand(b, loop.broadcast_load, dtype))

    return ctx.pointwise(call.meta.shape, call.meta.dtype, call.origin, body)


def clamp_expr(x: Expr, lo: Expr | None, hi: Expr | None) -> Expr:
    # Note: NaN propagates as in torch.clamp, since MAXIMUM and MINIMUM propagate it.
    if lo is not None:
        x = binary(Op.MAXIMUM, x, lo)
    if hi is not None:
        x = binary(Op.MINIMUM, x, hi)
    return x


@register("aten.clamp.default", "aten.clamp.Tensor", "aten.clamp_min.default", "aten.clamp_max.default",
          "aten.clamp_min.Tensor", "aten.clamp_max.Tensor")
def _clamp(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    lo = call.args.get("min")
    hi = call.args.get("max")
    present = [v for v in (lo, hi) if v is not None]
    compute = common_dtype(x, *present) if present else x.dtype

    def combine(a: list[Expr]) -> Expr:
        rest = iter(a[1:])
        return clamp_expr(a[0], next(rest) if lo is not None else None,
                          next(rest) if hi is not None else None)

    return map_pointwise(ctx, call, [x, *present], combine, compute)


@register("aten.hardtanh.default")
def _hardtanh(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    lo, hi = call["min_val"], call["max_val"]
    return map_pointwise(ctx, call, [x, lo, hi], lambda a: clamp_expr(a[0], a[1], a[2]), x.dtype)


@register("aten._to_copy.default", "aten.clone.default", "aten.lift_fresh_copy.default",
          "aten.detach.default", "aten.contiguous.default", "aten.to.dtype")
def _copy(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    return ctx.pointwise(call.meta.shape, call.meta.dtype, call.origin,
                         lambda loop: cast(loop.load(x, loop.idx), call.meta.dtype))


@register("aten.copy.default")
def _copy_into(ctx: Lower, call: Call) -> TensorValue:
    src = call.tensor("src")
    return ctx.pointwise(call.meta.shape, call.meta.dtype, call.origin,
                         lambda loop: cast(loop.broadcast_load(src), call.meta.dtype))


@register("aten.full.default", "aten.full_like.default", "aten.fill.Scalar", "aten.scalar_tensor.default",
          "aten.zeros.default", "aten.ones.default", "aten.zeros_like.default", "aten.ones_like.default",
          "aten.empty.memory_format", "aten.empty_like.default", "aten.new_zeros.default",
          "aten.new_ones.default", "aten.new_full.default", "aten.new_empty.default",
          "aten.empty_strided.default")
def _full(ctx: Lower, call: Call) -> TensorValue:
    name = call.target.split(".")[1]
    value: Any = call.args.get("fill_value", call.args.get("value", call.args.get("s")))
    if "zeros" in name or "empty" in name:
        value = 0
    elif "ones" in name:
        value = 1
    meta = call.meta
    fill: bool | int | float = value
    return ctx.pointwise(meta.shape, meta.dtype, call.origin, lambda loop: const(fill, meta.dtype))


@register("aten.fill.Tensor")
def _fill_tensor(ctx: Lower, call: Call) -> TensorValue:
    value = call.tensor("value")
    meta = call.meta
    return ctx.pointwise(meta.shape, meta.dtype, call.origin,
                         lambda loop: cast(loop.load(value, ()), meta.dtype))


@register("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(ctx: Lower, call: Call) -> TensorValue:
    x, mask, value = call.tensor("self"), call.tensor("mask"), call["value"]
    dtype = x.dtype.compute

    def body(loop: Any) -> Expr:
        fill = cast(loop.load(value, ()), dtype) if isinstance(value, TensorValue) else const(value, dtype)
        return where(loop.broadcast_load(mask), fill, cast(loop.broadcast_load(x), dtype))

    return ctx.pointwise(call.meta.shape, call.meta.dtype, call.origin, body)


# -- activations -----------------------------------------------------------------------------

def _activation(fn: Callable[[Expr, Call], Expr]) -> Callable[[Lower, Call], TensorValue]:
    def lower(ctx: Lower, call: Call) -> TensorValue:
        x = call.tensor("self")
        return map_pointwise(ctx, call, [x], lambda a: fn(a[0], call), _float_compute(call, [x]))

    return lower


def _c(x: Expr, value: float) -> Expr:
    return const(value, x.dtype)


def gelu(x: Expr, approximate: str) -> Expr:
    half_x = binary(Op.MUL, x, _c(x, 0.5))
    if approximate == "tanh":
        cube = binary(Op.MUL, binary(Op.MUL, x, x), x)
        inner = binary(Op.ADD, x, binary(Op.MUL, cube, _c(x, 0.044715)))
        t = unary(Op.TANH, binary(Op.MUL, inner, _c(x, math.sqrt(2 / math.pi))))
    else:
        t = unary(Op.ERF, binary(Op.MUL, x, _c(x, math.sqrt(0.5))))
    return binary(Op.MUL, half_x, binary(Op.ADD, t, _c(x, 1.0)))


def silu(x: Expr) -> Expr:
    return binary(Op.MUL, x, unary(Op.SIGMOID, x))


def _leaky(x: Expr, call: Call) -> Expr:
    slope = call.args.get("negative_slope", 0.01)
    return where(binary(Op.GT, x, _c(x, 0.0)), x, binary(Op.MUL, x, _c(x, slope)))


def _elu(x: Expr, call: Call) -> Expr:
    alpha, scale, input_scale = call["alpha"], call["scale"], call["input_scale"]
    neg = binary(Op.MUL, unary(Op.EXPM1, binary(Op.MUL, x, _c(x, input_scale))), _c(x, alpha))
    return binary(Op.MUL, where(binary(Op.GT, x, _c(x, 0.0)), x, neg), _c(x, scale))


def _hardsigmoid(x: Expr, call: Call) -> Expr:
    shifted = binary(Op.ADD, x, _c(x, 3.0))
    return binary(Op.TRUEDIV, clamp_expr(shifted, _c(x, 0.0), _c(x, 6.0)), _c(x, 6.0))


def _softplus(x: Expr, call: Call) -> Expr:
    beta, threshold = call["beta"], call["threshold"]
    bx = binary(Op.MUL, x, _c(x, beta))
    soft = binary(Op.TRUEDIV, unary(Op.LOG1P, unary(Op.EXP, bx)), _c(x, beta))
    return where(binary(Op.GT, bx, _c(x, threshold)), x, soft)


def _mish(x: Expr, call: Call) -> Expr:
    soft = unary(Op.LOG1P, unary(Op.EXP, x))
    return binary(Op.MUL, x, unary(Op.TANH, soft))


register("aten.gelu.default")(_activation(lambda x, c: gelu(x, c["approximate"])))
register("aten.silu.default")(_activation(lambda x, c: silu(x)))
register("aten.leaky_relu.default")(_activation(_leaky))
register("aten.elu.default")(_activation(_elu))
register("aten.hardsigmoid.default")(_activation(_hardsigmoid))
register("aten.hardswish.default")(_activation(lambda x, c: binary(Op.MUL, x, _hardsigmoid(x, c))))
register("aten.softplus.default")(_activation(_softplus))
register("aten.mish.default")(_activation(_mish))


# -- math that torch has as ops of their own, in terms of kiln's ---------------------------------

def _nan_skipping(op: Op) -> Callable[[Expr, Expr], Expr]:
    """fmax / fmin: the other operand where one is NaN (maximum / minimum propagate NaN)."""
    def combine(a: Expr, b: Expr) -> Expr:
        if not a.dtype.is_float:
            return apply_binary(op, a, b)
        return where(unary(Op.ISNAN, b), a, where(unary(Op.ISNAN, a), b, binary(op, a, b)))

    return combine


def _hypot(a: Expr, b: Expr) -> Expr:
    """sqrt(a^2 + b^2) without overflow in the squares: m * sqrt(1 + (n / m)^2)."""
    x, y = unary(Op.ABS, a), unary(Op.ABS, b)
    big, small = binary(Op.MAXIMUM, x, y), binary(Op.MINIMUM, x, y)
    ratio = binary(Op.TRUEDIV, small, where(binary(Op.EQ, big, _c(a, 0.0)), _c(a, 1.0), big))
    scaled = binary(Op.MUL, big, unary(Op.SQRT, binary(Op.ADD, _c(a, 1.0), binary(Op.MUL, ratio, ratio))))
    infinite = binary(Op.LOGICAL_OR, unary(Op.ISINF, a), unary(Op.ISINF, b))
    return where(infinite, _c(a, math.inf), scaled)


def _angle(x: Expr) -> Expr:
    """The angle of a real number: pi below zero, 0 from it, NaN for NaN."""
    return where(unary(Op.ISNAN, x), x, where(binary(Op.LT, x, _c(x, 0.0)), _c(x, math.pi), _c(x, 0.0)))


def _binary_with(fn: Callable[[Expr, Expr], Expr]) -> Callable[[Lower, Call], TensorValue]:
    def lower(ctx: Lower, call: Call) -> TensorValue:
        operands = [call["self"], call["other"]]
        return map_pointwise(ctx, call, operands, lambda a: fn(a[0], a[1]))

    return lower


def _float_binary(fn: Callable[[Expr, Expr], Expr]) -> Callable[[Lower, Call], TensorValue]:
    def lower(ctx: Lower, call: Call) -> TensorValue:
        operands = [call["self"], call["other"]]
        return map_pointwise(ctx, call, operands, lambda a: fn(a[0], a[1]), _float_compute(call, operands))

    return lower


register("aten.fmax.default")(_binary_with(_nan_skipping(Op.MAXIMUM)))
register("aten.fmin.default")(_binary_with(_nan_skipping(Op.MINIMUM)))
register("aten.hypot.default")(_float_binary(_hypot))
register("aten.ldexp.Tensor")(_float_binary(lambda a, b: binary(Op.MUL, a, unary(Op.EXP2, b))))
register("aten.angle.default")(_activation(lambda x, c: _angle(x)))
# Note: erfc and copysign are ops of their own, not 1 - erf (it cancels to 0 from x = 4 on) and
# comparisons (which cannot read a NaN's sign bit).
register("aten.erfc.default", "aten.special_erfc.default")(_activation(lambda x, c: unary(Op.ERFC, x)))
register("aten.copysign.Tensor", "aten.copysign.Scalar")(
    _float_binary(lambda a, b: binary(Op.COPYSIGN, a, b)))
