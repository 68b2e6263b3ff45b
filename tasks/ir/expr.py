"""Scalar expressions: the body of every computed buffer, and every index expression.

One closed Enum of ops, with group sets. An `Expr` is a frozen node holding only data (op,
dtype, children, one scalar argument) and a Merkle key: a hash of the op, dtype, argument and
the children's keys. Equality and hashing go through the key, so a shared sub-DAG is never
walked twice and two equal expressions built apart compare equal in O(1).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from tasks.ir.dtypes import DType


class Op(enum.Enum):
    # leaves
    VAR = "var"  # a loop index: arg is its name (i0.. pointwise, r0.. reduction)
    CONST = "const"  # arg: bool, int or float
    LOAD = "load"  # arg: buffer name; args: one index expression per buffer dimension
    # structure
    CAST = "cast"  # to the expression's dtype
    WHERE = "where"  # (cond, a, b)
    MASKED = "masked"  # (mask, body, other): body is evaluated (its loads done) only where mask
    # unary math
    NEG = "neg"
    ABS = "abs"
    EXP = "exp"
    EXP2 = "exp2"
    EXPM1 = "expm1"
    LOG = "log"
    LOG2 = "log2"
    LOG10 = "log10"
    LOG1P = "log1p"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    RECIPROCAL = "reciprocal"
    SIN = "sin"
    COS = "cos"
    TAN = "tan"
    ASIN = "asin"
    ACOS = "acos"
    ATAN = "atan"
    SINH = "sinh"
    COSH = "cosh"
    TANH = "tanh"
    ASINH = "asinh"
    ACOSH = "acosh"
    ATANH = "atanh"
    ERF = "erf"
    ERFINV = "erfinv"
    ERFC = "erfc"  # 1 - erf without the cancellation (erfc(9) is 4e-37, not 0)
    SIGMOID = "sigmoid"
    FLOOR = "floor"
    CEIL = "ceil"
    ROUND = "round"
    TRUNC = "trunc"
    SIGN = "sign"
    ISNAN = "isnan"
    ISINF = "isinf"
    LOGICAL_NOT = "logical_not"
    BITWISE_NOT = "bitwise_not"
    # binary math
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    TRUEDIV = "truediv"
    FLOORDIV = "floordiv"  # floor semantics, as Python and torch's rounding_mode="floor"
    MOD = "mod"  # sign of the divisor, as Python and torch.remainder
    FMOD = "fmod"  # sign of the dividend, as C and torch.fmod
    POW = "pow"
    MAXIMUM = "maximum"  # NaN-propagating, as torch.maximum
    MINIMUM = "minimum"
    ATAN2 = "atan2"
    COPYSIGN = "copysign"  # |a| with b's sign bit (-0.0 and a negative NaN included)
    BITWISE_AND = "bitwise_and"
    BITWISE_OR = "bitwise_or"
    BITWISE_XOR = "bitwise_xor"
    LSHIFT = "lshift"
    RSHIFT = "rshift"
    LOGICAL_AND = "logical_and"
    LOGICAL_OR = "logical_or"
    LOGICAL_XOR = "logical_xor"
    # comparisons (dtype bool; operands share a dtype)
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"


LEAVES = frozenset({Op.VAR, Op.CONST})
UNARY = frozenset({
    Op.NEG, Op.ABS, Op.EXP, Op.EXP2, Op.EXPM1, Op.LOG, Op.LOG2, Op.LOG10, Op.LOG1P, Op.SQRT,
    Op.RSQRT, Op.RECIPROCAL, Op.SIN, Op.COS, Op.TAN, Op.ASIN, Op.ACOS, Op.ATAN, Op.SINH,
    Op.COSH, Op.TANH, Op.ASINH, Op.ACOSH, Op.ATANH, Op.ERF, Op.ERFINV, Op.ERFC, Op.SIGMOID, Op.FLOOR,
    Op.CEIL, Op.ROUND, Op.TRUNC, Op.SIGN, Op.ISNAN, Op.ISINF, Op.LOGICAL_NOT, Op.BITWISE_NOT,
})
FLOAT_ONLY = frozenset({
    Op.EXP, Op.EXP2, Op.EXPM1, Op.LOG, Op.LOG2, Op.LOG10, Op.LOG1P, Op.SQRT, Op.RSQRT,
    Op.RECIPROCAL, Op.SIN, Op.COS, Op.TAN, Op.ASIN, Op.ACOS, Op.ATAN, Op.SINH, Op.COSH,
    Op.TANH, Op.ASINH, Op.ACOSH, Op.ATANH, Op.ERF, Op.ERFINV, Op.ERFC, Op.SIGMOID, Op.TRUEDIV, Op.ATAN2,
    Op.COPYSIGN,
})
BINARY = frozenset({
    Op.ADD, Op.SUB, Op.MUL, Op.TRUEDIV, Op.FLOORDIV, Op.MOD, Op.FMOD, Op.POW, Op.MAXIMUM,
    Op.MINIMUM, Op.ATAN2, Op.COPYSIGN, Op.BITWISE_AND, Op.BITWISE_OR, Op.BITWISE_XOR, Op.LSHIFT, Op.RSHIFT,
    Op.LOGICAL_AND, Op.LOGICAL_OR, Op.LOGICAL_XOR,
})
COMPARE = frozenset({Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE})
BOOL_RESULT = COMPARE | {Op.ISNAN, Op.ISINF, Op.LOGICAL_NOT, Op.LOGICAL_AND, Op.LOGICAL_OR,
                         Op.LOGICAL_XOR}
INT_ONLY = frozenset({Op.BITWISE_AND, Op.BITWISE_OR, Op.BITWISE_XOR, Op.LSHIFT, Op.RSHIFT,
                      Op.BITWISE_NOT})
ELEMENTWISE = UNARY | BINARY | COMPARE | {Op.CAST, Op.WHERE}
ARITY = {**dict.fromkeys(UNARY | {Op.CAST}, 1), **dict.fromkeys(BINARY | COMPARE, 2),
         Op.WHERE: 3, Op.MASKED: 3, Op.VAR: 0, Op.CONST: 0}

Scalar = bool | int | float


@dataclass(frozen=True, slots=True, eq=False)
class Expr:
    op: Op
    dtype: DType
    args: tuple[Expr, ...] = ()
    arg: str | Scalar | None = None
    key: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        text = "|".join([self.op.value, self.dtype.value, encode_arg(self.arg),
                         *(a.key for a in self.args)])
        object.__setattr__(self, "key", hashlib.blake2b(text.encode(), digest_size=16).hexdigest())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Expr) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        from tasks.ir.text import expr_text

        return f"Expr({expr_text(self)})"


def encode_arg(arg: str | Scalar | None) -> str:
    """The argument as text that tells its type apart: floats exactly, in hex."""
    if isinstance(arg, bool) or arg is None:
        return repr(arg)
    if isinstance(arg, float):
        return f"f:{arg.hex()}"
    if isinstance(arg, int):
        return f"i:{arg}"
    return f"s:{arg}"


# -- constructors ----------------------------------------------------------------------------

def var(name: str) -> Expr:
    return Expr(Op.VAR, DType.I64, (), name)


def const(value: Scalar, dtype: DType) -> Expr:
    if dtype is DType.BOOL:
        value = bool(value)
    elif dtype.is_float:
        value = float(value)
    else:
        value = int(value)
    return Expr(Op.CONST, dtype, (), value)


def index(value: int) -> Expr:
    return const(value, DType.I64)


def load(buffer: str, dtype: DType, indices: tuple[Expr, ...]) -> Expr:
    return Expr(Op.LOAD, dtype, indices, buffer)


def cast(x: Expr, dtype: DType) -> Expr:
    if x.dtype is dtype:
        return x
    if x.op is Op.CONST and isinstance(x.arg, bool | int | float):
        return const(_cast_value(x.arg, dtype), dtype)
    return Expr(Op.CAST, dtype, (x,))


def _cast_value(value: Scalar, dtype: DType) -> Scalar:
    if dtype is DType.BOOL:
        return bool(value)
    return float(value) if dtype.is_float else int(value)


def unary(op: Op, x: Expr) -> Expr:
    return Expr(op, DType.BOOL if op in BOOL_RESULT else x.dtype, (x,))


def binary(op: Op, a: Expr, b: Expr) -> Expr:
    if a.dtype is not b.dtype:
        raise ValueError(f"{op.value}: operands differ in dtype ({a.dtype.value}, {b.dtype.value})")
    return Expr(op, DType.BOOL if op in BOOL_RESULT else a.dtype, (a, b))


def where(cond: Expr, a: Expr, b: Expr) -> Expr:
    return Expr(Op.WHERE, a.dtype, (cond, a, b))


def masked(mask: Expr, body: Expr, other: Expr) -> Expr:
    return Expr(Op.MASKED, body.dtype, (mask, body, other))


# -- walking ---------------------------------------------------------------------------------

def walk(root: Expr) -> Iterator[Expr]:
    """Every distinct node below root, children before parents, each once."""
    seen: set[str] = set()
    stack: list[tuple[Expr, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if node.key in seen:
            continue
        if expanded:
            seen.add(node.key)
            yield node
            continue
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(node.args) if child.key not in seen)


def rewrite(root: Expr, fn: Callable[[Expr, tuple[Expr, ...]], Expr | None]) -> Expr:
    """Bottom-up rewrite: fn(node, new_children) returns a replacement or None (keep)."""
    done: dict[str, Expr] = {}
    for node in walk(root):
        children = tuple(done[c.key] for c in node.args)
        replaced = fn(node, children)
        if replaced is None:
            same = all(a is b for a, b in zip(children, node.args, strict=True))
            replaced = node if same else Expr(node.op, node.dtype, children, node.arg)
        done[node.key] = replaced
    return done[root.key]


def substitute(root: Expr, values: Mapping[str, Expr]) -> Expr:
    """Replace loop variables by expressions."""
    def swap(node: Expr, _children: tuple[Expr, ...]) -> Expr | None:
        if node.op is Op.VAR:
            return values.get(str(node.arg))
        return None

    return rewrite(root, swap)


def loads(root: Expr) -> list[Expr]:
    return [n for n in walk(root) if n.op is Op.LOAD]


def buffers_read(root: Expr) -> list[str]:
    return list(dict.fromkeys(str(n.arg) for n in loads(root)))


def free_vars(root: Expr) -> set[str]:
    return {str(n.arg) for n in walk(root) if n.op is Op.VAR}
