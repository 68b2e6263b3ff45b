"""Scalar expressions as C++ statements: one `auto` (well, typed) local per IR node, in order.

Index expressions are printed inline (they are small and affine). A load under a mask reads
only where its mask holds (`m ? p[i] : 0`), so a masked lane never touches memory it may not
own, and integer division helpers return 0 for a zero divisor so such a lane never traps.
fp16/bf16 values travel as their 16-bit patterns; arithmetic on them goes through float.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping

from tasks.codegen.ssa import SsaWriter
from tasks.ir import index as ix
from tasks.ir.dtypes import DType
from tasks.ir.expr import Expr, Op

CTYPES = {
    DType.BOOL: "bool", DType.U8: "uint8_t", DType.I8: "int8_t", DType.I16: "int16_t",
    DType.I32: "int32_t", DType.I64: "int64_t", DType.F16: "uint16_t", DType.BF16: "uint16_t",
    DType.F32: "float", DType.F64: "double",
}
_TO_FLOAT = {DType.F16: "kiln::half_to_float", DType.BF16: "kiln::bf16_to_float"}
_FROM_FLOAT = {DType.F16: "kiln::float_to_half", DType.BF16: "kiln::float_to_bf16"}

_UNARY_FN = {
    Op.ABS: "std::abs", Op.EXP: "kiln::exp", Op.EXP2: "std::exp2", Op.EXPM1: "std::expm1",
    Op.LOG: "std::log", Op.LOG2: "std::log2", Op.LOG10: "std::log10", Op.LOG1P: "std::log1p",
    Op.SQRT: "std::sqrt", Op.RSQRT: "kiln::rsqrt", Op.SIN: "std::sin", Op.COS: "std::cos",
    Op.TAN: "std::tan", Op.ASIN: "std::asin", Op.ACOS: "std::acos", Op.ATAN: "std::atan",
    Op.SINH: "std::sinh", Op.COSH: "std::cosh", Op.TANH: "kiln::tanh", Op.ASINH: "std::asinh",
    Op.ACOSH: "std::acosh", Op.ATANH: "std::atanh", Op.ERF: "kiln::erf", Op.ERFINV: "kiln::erfinv",
    Op.ERFC: "std::erfc",
    Op.SIGMOID: "kiln::sigmoid", Op.FLOOR: "std::floor", Op.CEIL: "std::ceil",
    Op.ROUND: "kiln::round_even", Op.TRUNC: "std::trunc", Op.SIGN: "kiln::sign",
    Op.ISNAN: "std::isnan", Op.ISINF: "std::isinf",
}
_INFIX = {
    Op.ADD: "+", Op.SUB: "-", Op.MUL: "*", Op.TRUEDIV: "/", Op.BITWISE_AND: "&", Op.BITWISE_OR: "|",
    Op.BITWISE_XOR: "^", Op.LSHIFT: "<<", Op.RSHIFT: ">>", Op.LOGICAL_AND: "&&", Op.LOGICAL_OR: "||",
    Op.LOGICAL_XOR: "!=", Op.EQ: "==", Op.NE: "!=", Op.LT: "<", Op.LE: "<=", Op.GT: ">", Op.GE: ">=",
}
_INDEX_OPS = (Op.VAR, Op.ADD, Op.SUB, Op.MUL, Op.FLOORDIV, Op.MOD)
_LIBM_BINARY = (Op.ATAN2, Op.POW, Op.FMOD, Op.COPYSIGN)  # overloaded, not kiln's templates
# Integer ops whose C++ operator (or libm call) is undefined or inexact where torch's is not: a
# shift past the width, an integer power through double, fmod through double (kiln_cpu.h).
_INTEGER_FN = {Op.POW: "kiln::ipow", Op.FMOD: "kiln::fmod_int", Op.LSHIFT: "kiln::shl",
               Op.RSHIFT: "kiln::shr"}
_BINARY_FN = {
    Op.FLOORDIV: "kiln::floordiv", Op.MOD: "kiln::mod", Op.MAXIMUM: "kiln::maximum",
    Op.MINIMUM: "kiln::minimum", Op.ATAN2: "std::atan2", Op.POW: "std::pow", Op.FMOD: "std::fmod",
    Op.COPYSIGN: "std::copysign",
}


def literal(value: object, dtype: DType) -> str:
    if dtype is DType.BOOL:
        return "true" if value else "false"
    if not dtype.is_float:
        return f"static_cast<{CTYPES[dtype]}>({int(value)}LL)"  # type: ignore[call-overload]
    text = _float_text(float(value))  # type: ignore[arg-type]
    if dtype.is_half:
        return f"{_FROM_FLOAT[dtype]}({text})"
    return text if dtype is DType.F64 else f"static_cast<float>({text})"


def _float_text(v: float) -> str:
    """An exact double literal: hex for finite values, the limits for the rest."""
    if math.isnan(v):
        return "std::numeric_limits<double>::quiet_NaN()"
    if math.isinf(v):
        return f"{'-' if v < 0 else ''}std::numeric_limits<double>::infinity()"
    return v.hex()


class ExprWriter(SsaWriter[str]):
    """Writes the statements that compute a set of roots; `ref(e)` is the C++ name of a node."""

    def __init__(self, load: Callable[[Expr, list[str], str | None], str], ranges: Mapping[str, int],
                 prefix: str = "v") -> None:
        super().__init__()
        self.load = load  # (load node, index texts, guard or None) -> C++ expression
        self.ranges = ranges
        self.prefix = prefix

    def index(self, e: Expr) -> str:
        """An int64 index expression, inline."""
        if e.key in self.names:
            return self.names[e.key]
        if e.op is Op.VAR:
            return str(e.arg)
        if e.op is Op.CONST:
            return f"{int(str(e.arg))}LL"
        a = [self.index(x) for x in e.args]
        if e.op in (Op.ADD, Op.SUB, Op.MUL):
            return f"({a[0]} {_INFIX[e.op]} {a[1]})"
        if e.op in (Op.FLOORDIV, Op.MOD):
            lo, _ = ix.bounds(e.args[0], self.ranges)
            if lo >= 0:
                return f"({a[0]} {'/' if e.op is Op.FLOORDIV else '%'} {a[1]})"
            return f"{_BINARY_FN[e.op]}<int64_t>({a[0]}, {a[1]})"
        raise ValueError(f"not an index expression: {e.op.value}")

    def _emit(self, e: Expr, guard: str | None) -> None:
        name = f"{self.prefix}{len(self.names)}"
        if e.op is Op.CONST:
            text = literal(e.arg, e.dtype)
        elif e.dtype is DType.I64 and e.op in _INDEX_OPS:
            text = self.index(e)
        else:
            if guard is not None:  # a load's (the only node a writer gives a guard)
                guard = re.sub(r"@(\w+)", lambda m: self.names[m.group(1)], guard)
            text = self._value(e, guard)
        self.names[e.key] = name
        self.lines.append(f"const {CTYPES[e.dtype]} {name} = {text};")

    def _value(self, e: Expr, guard: str | None) -> str:
        if e.op is Op.LOAD:
            return self.load(e, [self.index(a) for a in e.args], guard)
        a = [self.ref(x) for x in e.args]
        if e.op is Op.CAST:
            return cast_text(a[0], e.args[0].dtype, e.dtype)
        if e.op in (Op.WHERE, Op.MASKED):
            return f"({a[0]} ? {a[1]} : {a[2]})"
        operand = e.args[0].dtype
        if operand.is_half:
            floats = [f"{_TO_FLOAT[operand]}({x})" for x in a]
            text = _math(e.op, floats, DType.F32)
            return text if e.dtype is DType.BOOL else f"{_FROM_FLOAT[operand]}({text})"
        return f"static_cast<{CTYPES[e.dtype]}>({_math(e.op, a, operand)})"


def _math(op: Op, a: list[str], operand: DType) -> str:
    if op is Op.NEG:
        return f"(-{a[0]})"
    if op is Op.RECIPROCAL:
        return f"(1 / {a[0]})"
    if op in (Op.LOGICAL_NOT,):
        return f"(!{a[0]})"
    if op is Op.BITWISE_NOT:
        return f"(~{a[0]})"
    if op in _UNARY_FN:
        return f"{_UNARY_FN[op]}({a[0]})"
    if op in (Op.LOGICAL_AND, Op.LOGICAL_OR, Op.LOGICAL_XOR):
        return f"(static_cast<bool>({a[0]}) {_INFIX[op]} static_cast<bool>({a[1]}))"
    if op in _INTEGER_FN and not operand.is_float and operand is not DType.BOOL:
        return f"{_INTEGER_FN[op]}<{CTYPES[operand]}>({a[0]}, {a[1]})"
    if op in _INFIX:
        return f"({a[0]} {_INFIX[op]} {a[1]})"
    if op in (Op.FLOORDIV, Op.MOD) and operand.is_float:
        raise ValueError(f"{op.value} on floats reaches codegen; lowering should have rewritten it")
    if op in _BINARY_FN:
        t = CTYPES[operand]
        return f"{_BINARY_FN[op]}<{t}>({a[0]}, {a[1]})" if op not in _LIBM_BINARY \
            else f"{_BINARY_FN[op]}({a[0]}, {a[1]})"
    raise ValueError(f"no C++ for {op.value}")


def cast_text(x: str, src: DType, dst: DType) -> str:
    if src is dst:
        return x
    if src.is_half:
        x, src = f"{_TO_FLOAT[src]}({x})", DType.F32
        if dst is DType.F32:
            return x
    if dst.is_half:
        inner = x if src is DType.F32 else f"static_cast<float>({x})"
        return f"{_FROM_FLOAT[dst]}({inner})"
    return f"static_cast<{CTYPES[dst]}>({x})"
