"""Scalar expressions as Triton statements: one SSA local `tmpN = ...` per IR node, in order.

Every value is a block (or a 0-d tensor): a loop variable is a slice of the program's index
block, a constant a typed `tl.full([], ...)`, so dtypes follow the IR and never Python's
literal rules. A value's *shape* is the set of index blocks it depends on: {"x"} is a row
([XBLOCK] or [XBLOCK, 1]), {"r"} a reduction lane ([1, RBLOCK]), both a full block.

fp16/bf16 values live in fp32 registers, rounded through their storage type after every
operation (as the C++ kernels and eager do), and are stored back in their own type.

Note: `triton.language.extra.libdevice` has no implementation under TRITON_INTERPRET=1 in
triton 3.9 (its stubs return None), so the generated source calls it only through the
module-level name `libdevice`, which an interpreted run rebinds (see triton_kernel).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping

from tasks.codegen.ssa import SsaWriter
from tasks.ir import index as ix
from tasks.ir.dtypes import DType
from tasks.ir.expr import Expr, Op

Shape = frozenset[str]
NO_SHAPE: Shape = frozenset()

TL = {
    DType.BOOL: "tl.int1", DType.U8: "tl.uint8", DType.I8: "tl.int8", DType.I16: "tl.int16",
    DType.I32: "tl.int32", DType.I64: "tl.int64", DType.F16: "tl.float16", DType.BF16: "tl.bfloat16",
    DType.F32: "tl.float32", DType.F64: "tl.float64",
}

_TL_UNARY = {
    Op.EXP: "tl.exp", Op.EXP2: "tl.exp2", Op.LOG: "tl.log", Op.LOG2: "tl.log2", Op.SQRT: "tl.sqrt_rn",
    Op.RSQRT: "tl.rsqrt", Op.SIN: "tl.sin", Op.COS: "tl.cos", Op.ERF: "tl.erf", Op.FLOOR: "tl.floor",
    Op.CEIL: "tl.ceil", Op.SIGMOID: "tl.sigmoid",
}
_LIBDEVICE_UNARY = {
    Op.EXPM1: "expm1", Op.LOG10: "log10", Op.LOG1P: "log1p", Op.TAN: "tan", Op.ASIN: "asin",
    Op.ACOS: "acos", Op.ATAN: "atan", Op.SINH: "sinh", Op.COSH: "cosh", Op.TANH: "tanh",
    Op.ASINH: "asinh", Op.ACOSH: "acosh", Op.ATANH: "atanh", Op.ERFINV: "erfinv", Op.ERFC: "erfc",
    Op.ROUND: "rint", Op.TRUNC: "trunc",  # rint: halves to even, as torch.round
}
_LIBDEVICE_BINARY = {Op.ATAN2: "atan2", Op.POW: "pow", Op.FMOD: "fmod", Op.COPYSIGN: "copysign"}
_INFIX = {
    Op.ADD: "+", Op.SUB: "-", Op.MUL: "*", Op.TRUEDIV: "/", Op.BITWISE_AND: "&", Op.BITWISE_OR: "|",
    Op.BITWISE_XOR: "^", Op.EQ: "==", Op.NE: "!=", Op.LT: "<",
    Op.LE: "<=", Op.GT: ">", Op.GE: ">=",
}
_LOGICAL = {Op.LOGICAL_AND: "&", Op.LOGICAL_OR: "|", Op.LOGICAL_XOR: "!="}
_INDEX_OPS = (Op.VAR, Op.ADD, Op.SUB, Op.MUL, Op.FLOORDIV, Op.MOD)

# Small @triton.jit helpers, emitted into a kernel's module only when it uses them.
HELPERS = {
    "_kiln_floordiv": '''@triton.jit
def _kiln_floordiv(a, b):
    # Python's floor division; 0 for a zero divisor, so a masked lane never traps.
    d = tl.where(b == 0, 1, b)
    q = a // d
    q = tl.where(((a % d) != 0) & ((a < 0) != (d < 0)), q - 1, q)
    return tl.where(b == 0, 0, q)''',
    "_kiln_mod": '''@triton.jit
def _kiln_mod(a, b):
    # Python's modulo: the divisor's sign; 0 for a zero divisor.
    d = tl.where(b == 0, 1, b)
    r = a % d
    r = tl.where((r != 0) & ((r < 0) != (d < 0)), r + d, r)
    return tl.where(b == 0, 0, r)''',
    "_kiln_ipow": '''@triton.jit
def _kiln_ipow(a, b, BITS: tl.constexpr, SIGNED: tl.constexpr):
    # Integer powers as torch computes them (ATen's powi): square and multiply, wrapping on
    # overflow; a negative exponent gives 1 for a base of 1, +-1 for -1, 0 for any other base.
    result = a * 0 + 1
    base = a
    e = tl.where(b < 0, 0, b)
    for _ in tl.static_range(BITS):
        result = tl.where((e & 1) != 0, result * base, result)
        base = base * base
        e = e >> 1
    if SIGNED:  # an unsigned tensor cannot be compared with -1
        negative = tl.where(a == 1, 1, tl.where(a == -1, tl.where((b & 1) != 0, -1, 1), 0))
        result = tl.where(b < 0, negative.to(result.dtype), result)
    return result''',
    "_kiln_shl": '''@triton.jit
def _kiln_shl(a, b, BITS: tl.constexpr):
    # torch's shifts (ATen's BinaryOpsKernel): by a negative amount or by the width or more, 0
    # (Triton's << is LLVM's shl, undefined there).
    out = (b < 0) | (b >= BITS)
    return tl.where(out, 0, a << tl.where(out, 0, b))''',
    "_kiln_shr": '''@triton.jit
def _kiln_shr(a, b, BITS: tl.constexpr):
    # out of range: the sign's fill (a shift by BITS - 1), and 0 for what is not negative
    out = (b < 0) | (b >= BITS)
    shifted = a >> tl.where(out, BITS - 1, b)
    return tl.where(out & (a >= 0), 0, shifted)''',
    "_kiln_maximum": '''@triton.jit
def _kiln_maximum(a, b):
    # NaN-propagating, as torch.maximum.
    return tl.where((a > b) | (a != a), a, b)''',
    "_kiln_minimum": '''@triton.jit
def _kiln_minimum(a, b):
    return tl.where((a < b) | (a != a), a, b)''',
}


def literal(value: object, dtype: DType) -> str:
    """A typed 0-d constant (fp16/bf16 ones rounded, then held in fp32)."""
    if dtype is DType.BOOL:
        return f"tl.full([], {bool(value)}, tl.int1)"
    if not dtype.is_float:
        return f"tl.full([], {int(value)}, {TL[dtype]})"  # type: ignore[call-overload]
    text = float_text(float(value))  # type: ignore[arg-type]
    if dtype.is_half:
        return f"tl.full([], {text}, {TL[dtype]}).to(tl.float32)"
    return f"tl.full([], {text}, {TL[dtype]})"


def float_text(v: float) -> str:
    if math.isnan(v):
        return 'float("nan")'
    if math.isinf(v):
        return f'float("{"-" if v < 0 else ""}inf")'
    return repr(v)


def rep(dtype: DType) -> str:
    """The register type a value of this dtype lives in."""
    return "tl.float32" if dtype.is_half else TL[dtype]


def cast_text(x: str, src: DType, dst: DType) -> str:
    if src is dst:
        return x
    if dst is DType.BOOL:
        return f"({x} != 0)"
    if dst.is_half:
        return f"{x}.to({TL[dst]}).to(tl.float32)"
    if src.is_half and dst is DType.F32:
        return x
    return f"{x}.to({TL[dst]})"


LoadFn = Callable[[Expr, list[tuple[str, Shape]], "tuple[str, Shape] | None"], tuple[str, Shape]]


class ExprWriter(SsaWriter[tuple[str, Shape]]):
    """Writes the SSA lines that compute a set of roots; `ref(e)` is a node's (name, shape).

    `load(node, indices, guard)` returns the text and shape of a load, `var_shapes` maps each
    loop variable to its shape, and `fresh()` hands out kernel-unique names.
    """

    def __init__(self, load: LoadFn, ranges: Mapping[str, int], var_shapes: Mapping[str, Shape],
                 fresh: Callable[[], str], helpers: set[str]) -> None:
        super().__init__()
        self.load = load
        self.ranges = ranges
        self.var_shapes = var_shapes
        self.fresh = fresh
        self.helpers = helpers  # names of HELPERS the kernel needs

    def index(self, e: Expr) -> tuple[str, Shape]:
        """An integer index expression, inline (int32 or int64, as the loop variables are)."""
        if e.key in self.names:
            return self.names[e.key]
        if e.op is Op.VAR:
            return str(e.arg), self.var_shapes[str(e.arg)]
        if e.op is Op.CONST:
            return str(int(str(e.arg))), NO_SHAPE
        parts = [self.index(x) for x in e.args]
        a = [p[0] for p in parts]
        shape = frozenset().union(*(p[1] for p in parts))
        if e.op in (Op.ADD, Op.SUB, Op.MUL):
            return f"({a[0]} {_INFIX[e.op]} {a[1]})", shape
        if e.op in (Op.FLOORDIV, Op.MOD):
            lo, _ = ix.bounds(e.args[0], self.ranges)
            d_lo, _ = ix.bounds(e.args[1], self.ranges)
            if lo >= 0 and d_lo > 0:
                return f"({a[0]} {'//' if e.op is Op.FLOORDIV else '%'} {a[1]})", shape
            fn = "_kiln_floordiv" if e.op is Op.FLOORDIV else "_kiln_mod"
            self.helpers.add(fn)
            return f"{fn}({a[0]}, {a[1]})", shape
        raise ValueError(f"not an index expression: {e.op.value}")

    def _emit(self, e: Expr, guard: str | None) -> None:
        if e.op is Op.CONST:
            text, shape = literal(e.arg, e.dtype), NO_SHAPE
        elif e.dtype is DType.I64 and e.op in _INDEX_OPS:
            text, shape = self.index(e)
        elif e.op is Op.LOAD:
            masked = None if guard is None else self._guard(guard)
            text, shape = self.load(e, [self.index(a) for a in e.args], masked)
        else:
            parts = [self.ref(x) for x in e.args]
            shape = frozenset().union(*(p[1] for p in parts))
            text = self._value(e, [p[0] for p in parts])
        name = self.fresh()
        self.names[e.key] = (name, shape)
        self.lines.append(f"{name} = {text}")

    def _guard(self, key: str) -> tuple[str, Shape]:
        """The condition a masked load runs under: `@key` placeholders swapped for names."""
        shape: Shape = NO_SHAPE
        for k in re.findall(r"@(\w+)", key):
            shape |= self.names[k][1]
        text = re.sub(r"@(\w+)", lambda m: self.names[m.group(1)][0], key)
        text = text.replace("&&", "&").replace("||", "|")
        return text, shape

    def _value(self, e: Expr, a: list[str]) -> str:
        if e.op is Op.CAST:
            return cast_text(a[0], e.args[0].dtype, e.dtype)
        if e.op in (Op.WHERE, Op.MASKED):
            return f"tl.where({a[0]}, {a[1]}, {a[2]})"
        operand = e.args[0].dtype
        text = self._math(e.op, a, operand)
        if operand.is_half and e.dtype.is_half:
            return f"({text}).to({TL[operand]}).to(tl.float32)"
        return text

    def _math(self, op: Op, a: list[str], operand: DType) -> str:
        if op is Op.VAR:
            raise ValueError("a loop variable outside an index expression")
        if op is Op.NEG:
            return f"(-{a[0]})"
        if op is Op.ABS:
            return f"tl.abs({a[0]})" if operand is not DType.BOOL else a[0]
        if op is Op.RECIPROCAL:
            return f"(1.0 / {a[0]})"
        if op in (Op.LOGICAL_NOT,) or (op is Op.BITWISE_NOT and operand is DType.BOOL):
            return f"({a[0]} == 0)"
        if op is Op.BITWISE_NOT:
            return f"(~{a[0]})"
        if op is Op.ISNAN:
            return f"({a[0]} != {a[0]})"
        if op is Op.ISINF:
            return f'(tl.abs({a[0]}) == float("inf"))' if operand.is_float else f"({a[0]} != {a[0]})"
        if op is Op.SIGN:
            t = rep(operand)
            return (f"tl.where({a[0]} != {a[0]}, {a[0]}, "
                    f"({a[0]} > 0).to({t}) - ({a[0]} < 0).to({t}))")
        if op in (Op.FLOOR, Op.CEIL, Op.ROUND, Op.TRUNC) and not operand.is_float:
            return a[0]
        if op in _TL_UNARY or op in _LIBDEVICE_UNARY:
            if not operand.is_float:
                raise ValueError(f"{op.value} on {operand.value} reaches codegen; lowering should cast it")
            fn = _TL_UNARY.get(op) or f"libdevice.{_LIBDEVICE_UNARY[op]}"
            return f"{fn}({a[0]})"
        return self._binary(op, a, operand)

    def _binary(self, op: Op, a: list[str], operand: DType) -> str:
        if op in _LOGICAL:
            return f"(({a[0]} != 0) {_LOGICAL[op]} ({a[1]} != 0))"
        if op in (Op.FLOORDIV, Op.MOD):
            if operand.is_float:
                raise ValueError(f"{op.value} on floats reaches codegen; lowering should have rewritten it")
            fn = "_kiln_floordiv" if op is Op.FLOORDIV else "_kiln_mod"
            self.helpers.add(fn)
            if not _signed(operand):
                return f"{fn}({a[0]}, {a[1]})"
            # by -1: a negation that wraps, and 0, as torch's (LLVM leaves the lowest integer's
            # sdiv and srem by -1 undefined); an unsigned tensor cannot be compared with -1
            call = f"{fn}({a[0]}, tl.where({a[1]} == -1, 1, {a[1]}))"
            return f"tl.where({a[1]} == -1, 0 - {a[0]}, {call})" if op is Op.FLOORDIV else call
        if op in (Op.MAXIMUM, Op.MINIMUM):
            fn = "_kiln_maximum" if op is Op.MAXIMUM else "_kiln_minimum"
            self.helpers.add(fn)
            return f"{fn}({a[0]}, {a[1]})"
        if op is Op.FMOD and not operand.is_float:
            if not _signed(operand):
                return f"({a[0]} % {a[1]})"  # Triton's integer % truncates, as C's
            return f"({a[0]} % tl.where({a[1]} == -1, 1, {a[1]}))"  # by -1: 0 (above)
        if op is Op.POW and not operand.is_float:  # not through double: inexact above 2**53, saturating
            self.helpers.add("_kiln_ipow")
            return f"_kiln_ipow({a[0]}, {a[1]}, {operand.itemsize * 8}, {_signed(operand)})"
        if op in (Op.LSHIFT, Op.RSHIFT):
            fn = "_kiln_shl" if op is Op.LSHIFT else "_kiln_shr"
            self.helpers.add(fn)
            return f"{fn}({a[0]}, {a[1]}, {operand.itemsize * 8})"
        if op in _LIBDEVICE_BINARY:
            return f"libdevice.{_LIBDEVICE_BINARY[op]}({a[0]}, {a[1]})"
        if op is Op.TRUEDIV and not operand.is_float:
            raise ValueError("truediv on integers reaches codegen; lowering should cast it")
        if op in _INFIX:
            return f"({a[0]} {_INFIX[op]} {a[1]})"
        raise ValueError(f"no Triton for {op.value}")


def _signed(dtype: DType) -> bool:
    return dtype.is_int and dtype is not DType.U8
