"""A numeric test per lowering: the IR interpreter against eager torch, one aten call at a time.

Every entry of the lowering table has cases here (`test_every_lowering_has_a_case` lists any
that does not): float32 everywhere, float16 and bfloat16 for math ops, int64 and bool for
index and mask ops, odd sizes (1, 7, 1023), transposed and sliced inputs, broadcast and scalar
operands. Inputs are specs (`T`) made when a case runs, from a generator seeded by its id.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from tasks.ir.interpret import fallback_op
from tasks.lower.registry import LOWERINGS
from tests.lowering_harness import (
    T,
    Tolerance,
    b8,
    check_lowering,
    idx,
    ints,
    materialize,
    neg,
    perm,
    t,
    uniq,
)

HALF = ("f16", "bf16")


@dataclass
class Case:
    target: str  # "aten.add.Tensor", a key of LOWERINGS
    tag: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    tolerance: Tolerance | None = None
    shapes_only: bool = False  # uninitialized outputs (empty): compare shapes and dtypes

    @property
    def id(self) -> str:
        return f"{self.target.removeprefix('aten.')}-{self.tag}"


def c(target: str, tag: str, *args: Any, tolerance: Tolerance | None = None,
      shapes_only: bool = False, **kwargs: Any) -> Case:
    return Case(f"aten.{target}", tag, args, kwargs, tolerance, shapes_only)


# -- pointwise -------------------------------------------------------------------------------

FLOAT_MATH = {
    "exp": "randn", "exp2": "randn", "expm1": "randn", "log": "pos", "log2": "pos", "log10": "pos",
    "log1p": "pos", "sqrt": "pos", "rsqrt": "pos", "reciprocal": "randn", "sin": "randn",
    "cos": "randn", "tan": "unit", "asin": "unit", "acos": "unit", "atan": "randn", "sinh": "randn",
    "cosh": "randn", "tanh": "randn", "asinh": "randn", "acosh": "ge1", "atanh": "unit",
    "erf": "randn", "erfinv": "unit", "sigmoid": "randn",
}
INT_MATH = {"abs": "randn", "neg": "randn", "sign": "randn", "floor": "halves", "ceil": "halves",
            "round": "halves", "trunc": "halves", "relu": "randn"}
ACTIVATIONS: dict[str, dict[str, Any]] = {
    "gelu": {}, "silu": {}, "leaky_relu": {"negative_slope": 0.2}, "hardsigmoid": {},
    "hardswish": {}, "mish": {}, "elu": {"alpha": 1.5, "scale": 2.0, "input_scale": 0.5},
    "softplus": {"beta": 2.0, "threshold": 1.0},
}


def _unary_cases() -> list[Case]:
    cases = []
    fills = {**FLOAT_MATH, **INT_MATH, **dict.fromkeys(ACTIVATIONS, "randn")}
    for name, fill in fills.items():
        kwargs = ACTIVATIONS.get(name, {})
        cases += [c(f"{name}.default", "f32-1023", t(1023, fill=fill), **kwargs),
                  c(f"{name}.default", "f16-7x5-t", t(7, 5, dt="f16", fill=fill, lay="t"), **kwargs),
                  c(f"{name}.default", "bf16-1x7-s", t(1, 7, dt="bf16", fill=fill, lay="s"), **kwargs)]
    for name in INT_MATH:
        cases.append(c(f"{name}.default", "i64-7x5", ints(7, 5)))
    return [*cases,
            c("log.default", "f32-negative-nan", t(7, 5)),
            c("exp.default", "i64-promotes", ints(7)),
            c("sqrt.default", "b8-promotes", b8(7)),
            c("sign.default", "b8", b8(7)),
            c("gelu.default", "f32-tanh", t(7, 5, lay="t"), approximate="tanh"),
            c("gelu.default", "bf16-tanh", t(1023, dt="bf16"), approximate="tanh"),
            c("isnan.default", "f32-special", t(1023, fill="special")),
            c("isnan.default", "f16-special-t", t(7, 5, dt="f16", fill="special", lay="t")),
            c("isnan.default", "i64", ints(7)),
            c("isinf.default", "f32-special", t(1023, fill="special")),
            c("isinf.default", "bf16-special-s", t(7, 5, dt="bf16", fill="special", lay="s")),
            c("isinf.default", "i64", ints(7)),
            c("logical_not.default", "b8-7x5-t", b8(7, 5, lay="t")),
            c("logical_not.default", "f32-ints", t(1023, fill="ints")),
            c("logical_not.default", "i64-1", ints(1)),
            c("bitwise_not.default", "i64-7x5", ints(7, 5)),
            c("bitwise_not.default", "b8-1023", b8(1023)),
            c("bitwise_not.default", "u8-7-s", t(7, dt="u8", fill="idx:255", lay="s")),
            c("hardtanh.default", "f32-1023", t(1023)),
            c("hardtanh.default", "bf16-7x5-t", t(7, 5, dt="bf16", lay="t"), -0.5, 0.25),
            c("hardtanh.default", "f16-1", t(1, dt="f16"), 0.0, 6.0)]


# Binary ops over (tensor, tensor): "self" spec and "other" spec, per dtype group.
def _tensor_pairs(fill: str, dtypes: tuple[str, ...]) -> list[tuple[str, T, T]]:
    pairs = [("bcast-7x1-1x5", t(7, 1, dt=dtypes[0], fill=fill), t(1, 5, dt=dtypes[0], fill=fill)),
             ("1023-s", t(1023, dt=dtypes[0], fill=fill, lay="s"), t(1023, dt=dtypes[0], fill=fill)),
             ("0d", t(7, 5, dt=dtypes[0], fill=fill), t(dt=dtypes[0], fill=fill))]
    for dt in dtypes[1:]:
        pairs.append(("t-7x5-5", t(7, 5, dt=dt, fill=fill, lay="t"), t(5, dt=dt, fill=fill)))
        pairs.append(("1", t(1, dt=dt, fill=fill), t(1, dt=dt, fill=fill)))
    return [(f"{a.dtype}-{tag}", a, b) for tag, a, b in pairs]


def _binary(target: str, fill: str, dtypes: tuple[str, ...], scalar: Any = None,
            scalar_target: str | None = None) -> list[Case]:
    cases = [c(target, tag, a, b) for tag, a, b in _tensor_pairs(fill, dtypes)]
    if scalar is not None:
        cases.append(c(scalar_target or target.replace("Tensor", "Scalar"), f"{dtypes[0]}-scalar",
                       t(7, 5, dt=dtypes[0], fill=fill, lay="t"), scalar))
    return cases


FLOATS = ("f32", *HALF)
COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")


def _binary_cases() -> list[Case]:
    cases: list[Case] = []
    for name in ("mul", "add", "sub", "rsub"):
        cases += _binary(f"{name}.Tensor", "randn", FLOATS, 2.5)
        cases += _binary(f"{name}.Tensor", "ints", ("i64",), 3)
    for name in ("maximum", "minimum"):
        cases += _binary(f"{name}.default", "randn", FLOATS)
        cases += _binary(f"{name}.default", "ints", ("i64", "b8"))
    cases += _binary("atan2.default", "randn", FLOATS)
    for name in ("fmod", "remainder"):
        cases += _binary(f"{name}.Tensor", "nz", ("f32", *HALF), -1.5)
        cases += _binary(f"{name}.Tensor", "nz", ("i64",), 3)
    for name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
        cases += _binary(f"{name}.Tensor", "ints", ("i64", "i32"), 6)
        cases += _binary(f"{name}.Tensor", "bool", ("b8",), True)
    for name in ("bitwise_left_shift", "bitwise_right_shift"):
        cases += _binary(f"{name}.Tensor", "idx:8", ("i64", "i32"), 2,
                         scalar_target=f"{name}.Tensor_Scalar")
    for name in ("logical_and", "logical_or", "logical_xor"):
        cases += _binary(f"{name}.default", "bool", ("b8",))
        cases += _binary(f"{name}.default", "ints", ("f32", "i64"))
    for name in COMPARISONS:
        cases += _binary(f"{name}.Tensor", "ints", (*FLOATS, "i64"), 1.5)
        cases += _binary(f"{name}.Tensor", "bool", ("b8",), True)
        cases.append(c(f"{name}.Scalar", "i64-int", ints(7), 2))
        cases += [c(f"{name}.Scalar", f"{dt}-tenths", t(1023, dt=dt, fill="tenths"), 0.1) for dt in HALF]
    return [*cases,
            c("mul.Tensor", "b8", b8(7, 5), b8(5)),
            c("mul.Tensor", "i64-f32-promotes", ints(7, 5), t(7, 5)),
            c("mul.Scalar", "i64-float-promotes", ints(7), 0.5),
            c("add.Tensor", "f16-f32-promotes", t(7, 5, dt="f16"), t(7, 5, lay="t")),
            c("add.Tensor", "f32-expanded", t(7, 5, lay="e"), t(7, 5, lay="t")),
            c("add.Tensor", "f64", t(7, 5, dt="f64"), t(5, dt="f64")),
            c("add.Scalar", "b8-true", b8(7), True),
            c("add.Scalar", "b8-int-promotes", b8(7), 2),
            c("add.Tensor", "f32-alpha", t(7, 1), t(1, 5), alpha=-2.5),
            c("add.Tensor", "i64-alpha", ints(7), ints(7), alpha=3),
            c("add.Tensor", "b8", b8(7, 5), b8(5)),
            c("add.Scalar", "f32-alpha", t(1023), 2.0, 0.5),
            c("add.Scalar", "f16-tenths", t(1023, dt="f16", fill="tenths"), 0.1),
            c("remainder.Scalar", "bf16-tenths", t(1023, dt="bf16", fill="tenths"), 0.1),
            c("fmod.Scalar", "f16-tenths", t(1023, dt="f16", fill="tenths"), 0.1),
            c("sub.Tensor", "bf16-alpha", t(7, 5, dt="bf16"), t(5, dt="bf16"), alpha=2),
            c("sub.Scalar", "i64-alpha", ints(7), 2, 3),
            c("rsub.Tensor", "f32-alpha", t(7, 1), t(1, 5), alpha=0.5),
            c("rsub.Scalar", "i64-alpha", ints(7), 2, 3),
            c("maximum.default", "f32-nan", t(1023, fill="special"), t(1023)),
            c("minimum.default", "f32-nan", t(1023), t(1023, fill="special")),
            c("atan2.default", "i64-promotes", ints(7), t(7, dt="i64", fill="nz")),
            c("eq.Tensor", "i64-f32-promotes", ints(7, 5), t(7, 5, fill="ints")),
            c("lt.Scalar", "i64-float", ints(7), 0.5),
            c("ne.Tensor", "f32-nan", t(1023, fill="special"), t(1023, fill="special"))]


def _div_pow_cases() -> list[Case]:
    cases = _binary("div.Tensor", "randn", FLOATS, 0.3)
    cases += _binary("div.Tensor", "nz", ("i64",), 4)
    for mode in ("floor", "trunc"):
        cases += [
            c("div.Tensor_mode", f"f32-{mode}-bcast", t(7, 1, fill="halves"), t(1, 5, fill="nz"),
              rounding_mode=mode),
            c("div.Tensor_mode", f"f16-{mode}-t", t(7, 5, dt="f16", lay="t"), t(5, dt="f16", fill="nz"),
              rounding_mode=mode),
            c("div.Tensor_mode", f"i64-{mode}", ints(1023), t(1023, dt="i64", fill="nz"),
              rounding_mode=mode),
            c("div.Scalar_mode", f"i64-{mode}", ints(7, 5), -2, rounding_mode=mode),
            c("div.Scalar_mode", f"bf16-{mode}", t(7, dt="bf16"), 0.5, rounding_mode=mode)]
    return [*cases,
            c("div.Tensor_mode", "f32-none", t(7, 5), t(5, fill="nz"), rounding_mode=None),
            c("floor_divide.default", "i64-bcast", ints(7, 1), t(1, 5, dt="i64", fill="nz")),
            c("floor_divide.default", "f32-1023", t(1023), t(1023, fill="nz")),
            c("floor_divide.Scalar", "i64", ints(7), -3),
            c("floor_divide.Scalar", "f16-t", t(7, 5, dt="f16", lay="t"), 0.75),
            c("pow.Tensor_Tensor", "f32-bcast", t(7, 1, fill="pos"), t(1, 5)),
            c("pow.Tensor_Tensor", "f16-t", t(7, 5, dt="f16", fill="pos", lay="t"), t(5, dt="f16")),
            c("pow.Tensor_Tensor", "bf16-1023", t(1023, dt="bf16", fill="pos"), t(1023, dt="bf16")),
            c("pow.Tensor_Tensor", "i64", ints(7), idx(4, 7)),
            *(c("pow.Tensor_Scalar", f"f32-{e}", t(7, 5, fill="pos", lay="t"), e)
              for e in (2, 3, 0.5, -1, 2.5, 1, -2.0)),
            c("pow.Tensor_Scalar", "f16-2", t(7, dt="f16"), 2),
            c("pow.Tensor_Scalar", "bf16-half", t(7, dt="bf16", fill="pos"), 0.5),
            c("pow.Tensor_Scalar", "i64-3", ints(7), 3),
            c("pow.Tensor_Scalar", "i64-float-promotes", idx(5, 7), 1.5),
            c("pow.Scalar", "f32", 2.0, t(1023)),
            c("pow.Scalar", "i64-int", 3, idx(5, 7)),
            c("pow.Scalar", "bf16", 1.5, t(7, 5, dt="bf16", lay="t"))]


def _select_cases() -> list[Case]:
    mask = b8(7, 1)
    return [
        c("where.self", "f32-bcast", mask, t(1, 5), t(7, 5, lay="t")),
        c("where.self", "f16-1023", b8(1023), t(1023, dt="f16"), t(1023, dt="f16")),
        c("where.self", "bf16-mixed-f32", mask, t(7, 5, dt="bf16"), t(5)),
        c("where.self", "i64", b8(7), ints(7), ints(1)),
        c("where.self", "b8", mask, b8(7, 5), b8(5)),
        c("where.ScalarSelf", "f32", mask, 2.5, t(7, 5)),
        c("where.ScalarSelf", "i64-float-promotes", mask, 2.5, ints(1, 5)),
        c("where.ScalarOther", "f16", mask, t(7, 5, dt="f16", lay="t"), -1.0),
        c("where.ScalarOther", "i64", mask, ints(5), 7),
        c("where.Scalar", "float", mask, 1.0, 0.0),
        c("where.Scalar", "int", b8(7, 5, lay="t"), 3, -3),
        c("clamp.default", "f32-both", t(1023, fill="special"), -0.5, 0.5),
        c("clamp.default", "f16-min-t", t(7, 5, dt="f16", lay="t"), -0.5),
        c("clamp.default", "bf16-max", t(7, dt="bf16"), None, 0.25),
        c("clamp.default", "i64", ints(7, 5), -2, 3),
        c("clamp.default", "i64-float-promotes", ints(7), 0.5),
        c("clamp.default", "f32-crossed", t(7), 1.0, -1.0),
        c("clamp.Tensor", "f32-bcast", t(7, 5, lay="t"), t(7, 1, fill="unit"), t(1, 5, fill="pos")),
        c("clamp.Tensor", "f16-max-only", t(7, dt="f16"), None, t(7, dt="f16")),
        c("clamp.Tensor", "i64", ints(1023), ints(), None),
        c("clamp_min.default", "f32", t(1023), 0.1),
        c("clamp_min.default", "bf16-t", t(7, 5, dt="bf16", lay="t"), -0.1),
        c("clamp_max.default", "f32", t(1023, fill="special"), 0.1),
        c("clamp_max.default", "i64", ints(7), 1),
        c("clamp_min.Tensor", "f32-bcast", t(7, 5), t(5)),
        c("clamp_min.Tensor", "f16", t(7, 1, dt="f16"), t(1, 5, dt="f16")),
        c("clamp_max.Tensor", "f32-bcast", t(7, 5, lay="t"), t(7, 1)),
        c("clamp_max.Tensor", "i64", ints(7), ints(7)),
        c("masked_fill.Scalar", "f32-bcast", t(7, 5, lay="t"), mask, -1.5),
        c("masked_fill.Scalar", "f16-1023", t(1023, dt="f16"), b8(1023), math.inf),
        c("masked_fill.Scalar", "bf16", t(7, 5, dt="bf16"), b8(5), 2.0),
        c("masked_fill.Scalar", "i64", ints(7, 5), mask, 9),
        c("masked_fill.Scalar", "b8", b8(7, 5), mask, True),
        c("masked_fill.Tensor", "f32-0d", t(7, 5), mask, t()),
        c("masked_fill.Scalar", "f32-mask-wider", t(5), b8(7, 5), 0.5),
        c("masked_fill.Tensor", "i64-0d", ints(7), b8(7),
          ints()),
    ]


def _copy_cases() -> list[Case]:
    cases = []
    for name in ("clone", "lift_fresh_copy", "detach", "contiguous"):
        cases += [c(f"{name}.default", "f32-7x5-t", t(7, 5, lay="t")),
                  c(f"{name}.default", "bf16-1023-s", t(1023, dt="bf16", lay="s")),
                  c(f"{name}.default", "i64-1", ints(1))]
    return [*cases,
            c("_to_copy.default", "f32-f16", t(7, 5, lay="t"), dtype=torch.float16),
            c("_to_copy.default", "f32-bf16", t(1023), dtype=torch.bfloat16),
            c("_to_copy.default", "f32-i64-truncates", t(7, fill="halves"), dtype=torch.int64),
            c("_to_copy.default", "f32-b8", t(7, 5, fill="ints"), dtype=torch.bool),
            c("_to_copy.default", "b8-f32", b8(7), dtype=torch.float32),
            c("_to_copy.default", "i64-i32", ints(7, lay="s"), dtype=torch.int32),
            c("_to_copy.default", "f16-f32-s", t(7, 5, dt="f16", lay="s"), dtype=torch.float32),
            c("_to_copy.default", "f32-layout", t(7, 5, lay="t"), memory_format=torch.contiguous_format),
            c("to.dtype", "f32-f16", t(7, 5, lay="t"), torch.float16),
            c("to.dtype", "i64-f32", ints(1023), torch.float32),
            c("copy.default", "f32-bcast", t(7, 5), t(1, 5)),
            c("copy.default", "f16-from-f32-t", t(7, 5, dt="f16"), t(7, 5, lay="t")),
            c("copy.default", "i64-from-f32", ints(7), t(7, fill="halves"))]


def _fill_cases() -> list[Case]:
    like = t(7, 5, lay="t")
    return [
        c("full.default", "f32", [7, 5], 2.5),
        c("full.default", "i64", [1023], 3, dtype=torch.int64),
        c("full.default", "b8", [1], True),
        c("full.default", "f16-inf", [7], -math.inf, dtype=torch.float16),
        c("full_like.default", "f32-t", like, 1.5),
        c("full_like.default", "i64-dtype", like, 4, dtype=torch.int64),
        c("fill.Scalar", "f32", like, -2.0),
        c("fill.Scalar", "bf16", t(1023, dt="bf16"), 0.1),
        c("fill.Tensor", "f32-0d", like, t()),
        c("fill.Tensor", "i64-from-f32", ints(7), t(fill="halves")),
        c("scalar_tensor.default", "f32", 2.5),
        c("scalar_tensor.default", "i64", 3, dtype=torch.int64),
        c("zeros.default", "f32", [7, 5]),
        c("zeros.default", "i64", [1023], dtype=torch.int64),
        c("ones.default", "f16", [7, 1], dtype=torch.float16),
        c("ones.default", "b8", [1], dtype=torch.bool),
        c("zeros_like.default", "f32-t", like),
        c("ones_like.default", "bf16", like, dtype=torch.bfloat16),
        c("new_zeros.default", "f32", like, [3, 4]),
        c("new_ones.default", "i64", like, [7], dtype=torch.int64),
        c("new_full.default", "f16", t(1, dt="f16"), [1023], 0.5),
        c("new_empty.default", "f32", like, [7, 5], shapes_only=True),
        c("empty.memory_format", "f32", [7, 5], shapes_only=True),
        c("empty.memory_format", "i64", [1023], dtype=torch.int64, shapes_only=True),
        c("empty_like.default", "f32-t", like, shapes_only=True),
        c("empty_strided.default", "f32", [7, 5], [5, 1], shapes_only=True),
        c("arange.default", "int", 1023),
        c("arange.default", "float", 7.5),
        c("arange.start", "int", -3, 4),
        c("arange.start", "f16", 1, 8, dtype=torch.float16),
        c("arange.start_step", "float", 0.5, 3.0, 0.25),
        c("arange.start_step", "int-negative", 7, -8, -3),
        c("arange.start_step", "i32", 0, 1023, 1, dtype=torch.int32),
        c("arange.start_step", "bf16", 0, 7, 1, dtype=torch.bfloat16),
    ]


# -- views -----------------------------------------------------------------------------------

def _view_cases() -> list[Case]:
    x3 = t(7, 3, 5)
    cases = []
    for name in ("view", "_unsafe_view", "view_copy", "reshape"):
        cases += [c(f"{name}.default", "f32-s-split-last", t(7, 6, lay="s"), [7, 2, 3]),
                  c(f"{name}.default", "i64-split-dims", ints(1023), [3, 11, 31])]
    for name in ("alias", "alias_copy", "lift_fresh"):
        cases += [c(f"{name}.default", "f32-t", t(7, 5, lay="t")),
                  c(f"{name}.default", "b8", b8(7))]
    for name in ("expand", "expand_copy"):
        cases += [c(f"{name}.default", "f32-lead", t(7, 1), [3, 7, 5]),
                  c(f"{name}.default", "f32-0d", t(), [7, 5]),
                  c(f"{name}.default", "i64-minus1", ints(1, 5), [7, -1])]
    for name in ("unsqueeze", "unsqueeze_copy"):
        cases += [c(f"{name}.default", "f32-neg-dim", t(7, 5, lay="t"), -1),
                  c(f"{name}.default", "f16-0", t(1023, dt="f16"), 0)]
    for name in ("select", "select_copy"):
        cases += [c(f"{name}.int", "f32-neg", x3, 1, -1),
                  c(f"{name}.int", "i64-t", ints(7, 5, lay="t"), 0, 3)]
    for name in ("slice", "slice_copy"):
        cases += [c(f"{name}.Tensor", "f32-step", t(7, 1023), 1, 1, 1000, 7),
                  c(f"{name}.Tensor", "f32-neg-start-t", t(7, 5, lay="t"), 0, -3, 2**63 - 1),
                  c(f"{name}.Tensor", "i64-empty", ints(7), 0, 9, 12)]
    return [*cases,
            c("reshape.default", "f32-minus1", x3, [-1, 5]),
            c("reshape.default", "f32-t-flatten", t(7, 5, lay="t"), [35]),
            c("reshape.default", "f16-t-regroup", t(6, 7, 5, dt="f16", lay="t"), [3, -1, 7]),
            c("view.default", "f32-0d", t(1), []),
            c("permute.default", "f32", x3, [2, 0, 1]),
            c("permute.default", "f16-t", t(3, 7, 5, dt="f16", lay="t"), [1, -1, 0]),
            c("permute_copy.default", "i64", ints(7, 3, 5), [1, 2, 0]),
            c("transpose.int", "f32-neg", x3, -1, 0),
            c("transpose.int", "b8", b8(7, 5), 0, 1),
            c("t.default", "f32-2d", t(7, 5, lay="t")),
            c("t.default", "f32-1d", t(7)),
            c("numpy_T.default", "f32-3d", x3),
            c("numpy_T.default", "f32-2d-t", t(7, 5, lay="t")),
            c("squeeze.default", "f32", t(7, 1, 5, 1)),
            c("squeeze.dim", "f32-kept", t(7, 1, 5), 0),
            c("squeeze.dim", "f32-neg", t(7, 5, 1), -1),
            c("squeeze.dim", "f32-0d", t(), 0),
            c("squeeze.dims", "i64", ints(1, 7, 1), [0, 2]),
            c("squeeze_copy.dims", "f32", t(1, 7, 1), [0, 1]),
            c("narrow.default", "f32", t(7, 5, lay="t"), 1, 2, 3),
            c("narrow.default", "f32-neg-start", t(1023), 0, -7, 7),
            c("split.Tensor", "f32-7by3", t(7, 5, lay="t"), 3),
            c("split.Tensor", "i64-dim1", ints(5, 1023), 512, 1),
            c("split_with_sizes.default", "f32", t(7, 5), [2, 0, 3], 1),
            c("split_with_sizes_copy.default", "f16", t(7, 5, dt="f16", lay="t"), [1, 6]),
            c("unbind.int", "f32", x3, 1),
            c("unbind.int", "b8-t", b8(7, 5, lay="t")),
            c("chunk.default", "f32", t(7, 5), 3),
            c("chunk.default", "f32-uneven", t(6, 5, lay="t"), 4, 0),
            c("flip.default", "f32", x3, [0, -1]),
            c("flip.default", "i64-t", ints(7, 5, lay="t"), [1]),
            c("repeat.default", "f32-lead", t(7, 1), [2, 3, 5]),
            c("repeat.default", "i64-t", ints(3, 5, lay="t"), [2, 1]),
            c("as_strided.default", "f32-windows", t(1023), [7, 5], [100, 3], 2),
            c("as_strided.default", "f32-of-view", t(7, 5), [3, 3], [1, 5]),
            c("as_strided.default", "f32-t-fallback", t(7, 5, lay="t"), [5, 7], [1, 5]),
            c("as_strided_copy.default", "i64", ints(7, 5), [5, 2], [1, 5], 3)]


def _no_op_cases() -> list[Case]:
    x = t(7, 5)
    return [
        c("_assert_tensor_metadata.default", "f32", x, None, None, torch.float32),
        c("_assert_async.default", "b8", t(dt="b8", fill="near1")),
        c("_assert_async.msg", "b8", t(dt="b8", fill="near1"), "must hold"),
        c("_assert_scalar.default", "true", True, "must hold"),
        c("sym_constrain_range_for_size.default", "int", 5, min=2, max=10),
    ]


# -- reductions ------------------------------------------------------------------------------

def _reduction_cases() -> list[Case]:
    wide = t(7, 1023)
    cases = [
        c("sum.dim_IntList", "f32-7x1023-last", wide, [1]),
        c("sum.dim_IntList", "f32-t-first-keepdim", t(7, 5, lay="t"), [0], True),
        c("sum.dim_IntList", "f16-neg-keepdim", t(7, 1023, dt="f16"), [-1], True),
        c("sum.dim_IntList", "bf16-two-dims", t(7, 3, 5, dt="bf16"), [0, 2]),
        c("sum.dim_IntList", "i64", ints(7, 5), [1]),
        c("sum.dim_IntList", "b8-counts", b8(7, 5), [0]),
        c("sum.dim_IntList", "f32-none", t(7, 5), None),
        c("sum.dim_IntList", "f32-empty-list", t(7, 5, lay="t"), []),
        c("sum.dim_IntList", "f32-expanded", t(1023, 5, lay="e"), [0]),
        c("sum.dim_IntList", "f32-empty-input", t(0, 5), [0]),
        c("sum.dim_IntList", "f64", t(7, 1023, dt="f64"), [1]),
        c("sum.dim_IntList", "f32-dtype-f64", t(7, 5), [1], dtype=torch.float64),
        c("sum.dim_IntList", "i64-dtype-f32", ints(7, 5), [1], dtype=torch.float32),
        c("sum.default", "f32-1023", t(1023)),
        c("sum.default", "f16-t", t(7, 5, dt="f16", lay="t")),
        c("sum.default", "b8", b8(1023)),
        c("sum.default", "i32-to-i64", t(7, dt="i32", fill="ints")),
        c("sum.default", "f32-0d", t()),
        c("prod.dim_int", "f32", t(7, 5, fill="near1"), 1),
        c("prod.dim_int", "f16-keepdim-t", t(7, 5, dt="f16", fill="near1", lay="t"), 0, True),
        c("prod.dim_int", "i64", t(7, 5, dt="i64", fill="nz"), 1),
        c("prod.default", "f32-1", t(1, fill="near1")),
        c("prod.default", "bf16-7", t(7, dt="bf16", fill="near1")),
        c("prod.default", "b8", b8(7)),
    ]
    for name in ("amax", "amin"):
        cases += [c(f"{name}.default", "f32-last", wide, [-1]),
                  c(f"{name}.default", "f16-keepdim-t", t(7, 5, dt="f16", lay="t"), [0], True),
                  c(f"{name}.default", "bf16-all", t(7, 3, 5, dt="bf16"), []),
                  c(f"{name}.default", "i64-two", ints(7, 3, 5), [0, 2]),
                  c(f"{name}.default", "f32-nan", t(7, 5, fill="special"), [1]),
                  c(f"{name}.default", "b8", b8(7, 5), [1])]
    for name in ("max", "min"):
        cases += [c(f"{name}.default", "f32-1023", t(1023)),
                  c(f"{name}.default", "i64-t", ints(7, 5, lay="t")),
                  c(f"{name}.default", "bf16-1", t(1, dt="bf16")),
                  c(f"{name}.dim", "f32-last", wide, -1),
                  c(f"{name}.dim", "f16-keepdim-t", t(7, 5, dt="f16", lay="t"), 0, True),
                  c(f"{name}.dim", "i64-ties", ints(7, 5), 1),
                  c(f"{name}.dim", "f32-nan", t(7, 5, fill="special"), 1),
                  c(f"{name}.dim", "b8-ties", b8(7, 5), 0)]
    for name in ("argmax", "argmin"):
        cases += [c(f"{name}.default", "f32-flat", t(7, 5, lay="t")),
                  c(f"{name}.default", "f32-flat-keepdim", t(7, 5), None, True),
                  c(f"{name}.default", "f16-dim", t(7, 1023, dt="f16"), 1),
                  c(f"{name}.default", "i64-ties-keepdim", ints(7, 5), 0, True),
                  c(f"{name}.default", "bf16-1", t(1, dt="bf16"), 0)]
    for name in ("any", "all"):
        cases += [c(f"{name}.default", "b8-1023", b8(1023)),
                  c(f"{name}.default", "f32-ints", t(7, 5, fill="ints")),
                  c(f"{name}.dim", "b8-t", b8(7, 5, lay="t"), 1),
                  c(f"{name}.dim", "i64-keepdim", ints(7, 5), 0, True),
                  c(f"{name}.dims", "b8-two", b8(7, 3, 5), [0, 2]),
                  c(f"{name}.dims", "b8-none", b8(7, 5), None, True)]
    return cases


def _statistics_cases() -> list[Case]:
    wide = t(7, 1023)
    cases = [
        c("mean.dim", "f32-last", wide, [-1]),
        c("mean.dim", "f16-keepdim-t", t(7, 5, dt="f16", lay="t"), [0], True),
        c("mean.dim", "bf16-two", t(7, 3, 5, dt="bf16"), [0, 2]),
        c("mean.dim", "f32-none", t(7, 5), None),
        c("mean.dim", "f16-dtype-f32", t(7, 5, dt="f16"), [1], dtype=torch.float32),
        c("mean.default", "f32-1023", t(1023)),
        c("mean.default", "bf16-1", t(1, dt="bf16")),
        c("var.correction", "f32-last", wide, [1]),
        c("var.correction", "f16-c0-keepdim", t(7, 5, dt="f16", lay="t"), [0], correction=0, keepdim=True),
        c("var.correction", "bf16-all", t(7, 5, dt="bf16"), None, correction=2),
        c("var.correction", "f32-single-nan", t(7, 1), [1]),
        c("var.correction", "f32-expanded-zero", t(7, 5, lay="e"), [0]),
        c("var.correction", "f32-big-correction", t(7, 5), [1], correction=7),
        c("var.dim", "f32-biased", t(7, 5, lay="t"), [1], False),
        c("var.default", "f32", t(1023)),
        c("var.default", "f16-biased", t(7, dt="f16"), False),
        c("std.correction", "f32-two-dims", t(7, 3, 5), [0, 2]),
        c("std.correction", "bf16-keepdim", t(7, 1023, dt="bf16"), [1], keepdim=True),
        c("std.dim", "f32-unbiased", t(7, 5, lay="t"), [0], True, True),
        c("std.default", "f16", t(1023, dt="f16")),
        c("var_mean.correction", "f32", wide, [1]),
        c("var_mean.correction", "f16-keepdim", t(7, 5, dt="f16", lay="t"), [0], correction=0, keepdim=True),
        c("var_mean.dim", "f32-all", t(7, 5), None, False),
        c("var_mean.dim", "bf16", t(7, 5, dt="bf16"), [1], True, True),
        c("std_mean.correction", "f32", t(7, 5, lay="t"), [1]),
        c("std_mean.correction", "bf16-all", t(7, 3, dt="bf16"), None, correction=0),
        c("logsumexp.default", "f32-last", wide, [1]),
        c("logsumexp.default", "f16-keepdim-t", t(7, 5, dt="f16", lay="t"), [0], True),
        c("logsumexp.default", "bf16-two", t(7, 3, 5, dt="bf16"), [0, 2]),
        c("logsumexp.default", "f32-inf", t(7, 5, fill="special"), [1]),
        c("logsumexp.default", "i64-promotes", ints(7, 5), [1]),
    ]
    for name in ("_softmax", "_log_softmax"):
        cases += [c(f"{name}.default", "f32-last", wide, -1, False),
                  c(f"{name}.default", "f16-first-t", t(7, 5, dt="f16", lay="t"), 0, False),
                  c(f"{name}.default", "bf16-mid", t(7, 3, 5, dt="bf16"), 1, False),
                  c(f"{name}.default", "f32-1", t(1), 0, False),
                  c(f"{name}.default", "f32-inf-rows", t(7, 5, fill="special"), 1, False),
                  c(f"{name}.default", "f32-0d", t(), 0, False)]
    for name in ("softmax", "log_softmax"):
        cases += [c(f"{name}.int", "f32-last", wide, -1),
                  c(f"{name}.int", "f16-t", t(7, 5, dt="f16", lay="t"), 1),
                  c(f"{name}.int", "f16-to-f32", t(7, 5, dt="f16"), 1, torch.float32),
                  c(f"{name}.int", "bf16-0", t(1, 7, dt="bf16"), 0)]
    return cases


def _norm_cases() -> list[Case]:
    w, b = t(1023), t(1023)
    return [
        c("native_layer_norm.default", "f32-1023", t(7, 1023), [1023], w, b, 1e-5),
        c("native_layer_norm.default", "f32-t-no-affine", t(7, 5, lay="t"), [5], None, None, 1e-5),
        c("native_layer_norm.default", "f16", t(7, 5, dt="f16"), [5], t(5, dt="f16"), t(5, dt="f16"), 1e-5),
        c("native_layer_norm.default", "bf16-two-dims", t(3, 7, 5, dt="bf16"), [7, 5],
          t(7, 5, dt="bf16"), None, 1e-5),
        c("native_layer_norm.default", "f32-1", t(7, 1), [1], t(1), t(1), 1e-5),
        c("native_layer_norm.default", "f32-bias-only", t(7, 5), [5], None, t(5), 1e-5),
        c("_native_batch_norm_legit_no_training.default", "f32-4d",
          t(2, 7, 3, 5), t(7), t(7), t(7), t(7, fill="pos"), 0.1, 1e-5),
        c("_native_batch_norm_legit_no_training.default", "f32-2d-no-affine",
          t(5, 7, lay="t"), None, None, t(7), t(7, fill="pos"), 0.1, 1e-3),
        c("_native_batch_norm_legit_no_training.default", "f32-bias-only",
          t(2, 7, 3), None, t(7), t(7), t(7, fill="pos"), 0.1, 1e-5),
        c("_native_batch_norm_legit_no_training.default", "bf16-3d",
          t(2, 7, 5, dt="bf16"), t(7, dt="bf16"), t(7, dt="bf16"), t(7, dt="bf16"),
          t(7, dt="bf16", fill="pos"), 0.1, 1e-5),
        c("linalg_vector_norm.default", "f32-2", t(7, 5), 2.0, None, False),
        c("linalg_vector_norm.default", "f32-inf-dim-keep", t(7, 5, lay="t"), float("inf"), [1], True),
        c("linalg_vector_norm.default", "f32-0", t(7, 5, fill="ints"), 0.0, [0], False),
        c("linalg_vector_norm.default", "f32-3-f64", t(7, 5), 3.0, None, False, dtype=torch.float64),
        c("dist.default", "f32-broadcast-p3", t(7, 5), t(5), 3.0),
        c("dist.default", "f32-1", t(7, 5), t(7, 5), 1.0),
        c("native_group_norm.default", "f32-4d", t(2, 6, 3, 5), t(6), t(6), 2, 6, 15, 3, 1e-5),
        c("native_group_norm.default", "f32-bias-only", t(2, 6, 3, 5), None, t(6), 2, 6, 15, 3, 1e-5),
        c("native_group_norm.default", "f32-3d-no-affine", t(2, 7, 1023), None, None, 2, 7, 1023, 7, 1e-5),
        c("native_group_norm.default", "f16", t(1, 4, 5, dt="f16"), t(4, dt="f16"), t(4, dt="f16"),
          1, 4, 5, 2, 1e-5),
        c("native_dropout.default", "f32-eval", t(7, 5, lay="t"), 0.5, False),
        c("dropout.default", "f32-eval", t(7, 5, lay="t"), 0.5, False),
        c("dropout.default", "bf16-p0", t(1023, dt="bf16"), 0.0, True),
    ]


# -- indexing --------------------------------------------------------------------------------

def _cat_pad_cases() -> list[Case]:
    pieces = [t(7, 2), t(7, 5, lay="t"), t(7, 1)]
    cases = []
    for name in ("cat", "concat"):
        cases += [c(f"{name}.default", "f32-dim1-t", pieces, 1),
                  c(f"{name}.default", "f32-1-7-1023", [t(1), t(7), t(1023)])]
    return [*cases,
            c("cat.default", "f16-f32-promotes", [t(3, 5, dt="f16"), t(4, 5)]),
            c("cat.default", "f32-expanded-s", [t(3, 5, lay="e"), t(4, 5, lay="s")]),
            c("cat.default", "i64-b8-promotes", [ints(3), b8(4)]),
            c("cat.default", "i64-neg-dim", [ints(7, 1), ints(7, 2)], -1),
            c("cat.default", "b8-one", [b8(7)]),
            c("cat.default", "f32-legacy-empty", [t(7, 5), t(0), t(1, 5)]),
            c("cat.default", "bf16-empty-piece", [t(0, 5, dt="bf16"), t(7, 5, dt="bf16")]),
            c("stack.default", "f32-0", [t(7, 5), t(7, 5, lay="t")]),
            c("stack.default", "i64-last", [ints(7)] * 3, -1),
            c("stack.default", "f16-mid", [t(1, 5, dt="f16"), t(1, 5, dt="f16")], 1),
            c("stack.default", "f32-0d", [t(), t(), t()]),
            c("constant_pad_nd.default", "f32-last", t(7, 5, lay="t"), [2, 3]),
            c("constant_pad_nd.default", "f32-two-dims", t(3, 7, 5), [1, 0, 0, 2], -1.0),
            c("constant_pad_nd.default", "f32-negative", t(7, 1023), [-3, 2, 1, -2], 0.5),
            c("constant_pad_nd.default", "f16-1", t(1, dt="f16"), [7, 7], math.inf),
            c("constant_pad_nd.default", "i64", ints(7), [1, 1], 9),
            c("constant_pad_nd.default", "b8", b8(7, 5), [0, 2], True)]


def _gather_cases() -> list[Case]:
    x = t(7, 5)
    return [
        c("index_select.default", "f32-dim0", x, 0, idx(7, 9)),
        c("index_select.default", "f32-expanded", t(7, 5, lay="e"), 1, idx(5, 9)),
        c("index_select.default", "f16-dim1-t", t(7, 5, dt="f16", lay="t"), 1, idx(5, 3)),
        c("index_select.default", "i64-i32-index", ints(1023), 0,
          idx(1023, 7, dt="i32")),
        c("index_select.default", "b8-0d-index", b8(7, 5), 1, idx(5)),
        c("gather.default", "f32-dim0", x, 0, idx(7, 3, 5)),
        c("gather.default", "f32-dim1-smaller-t", t(7, 5, lay="t"), 1, idx(5, 7, 3)),
        c("gather.default", "bf16-neg-dim", t(7, 1023, dt="bf16"), -1, idx(1023, 7, 9)),
        c("gather.default", "i64-1", ints(1), 0, idx(1, 1)),
        c("embedding.default", "f32-2d-indices", t(7, 5), idx(7, 3, 4)),
        c("embedding.default", "f16-t", t(7, 5, dt="f16", lay="t"), idx(7, 1023)),
        c("embedding.default", "bf16-i32", t(1023, 7, dt="bf16"), idx(1023, 5, dt="i32")),
        c("embedding.default", "f32-padding-idx", t(7, 5), idx(7, 9), 0),
        c("embedding.default", "f32-0d-index", t(7, 5), idx(7)),
    ]


def _index_cases() -> list[Case]:
    x3 = t(7, 3, 5)
    i7, i5 = idx(7, 4), idx(5, 4)
    cases = []
    for name in ("index", "_unsafe_index"):
        cases += [c(f"{name}.Tensor", "f32-first", t(7, 5, lay="t"), [idx(7, 9)]),
                  c(f"{name}.Tensor", "f32-pair", x3, [i7, idx(3, 4)])]
    return [*cases,
            c("index.Tensor", "f32-neg", t(1023), [neg(1023, 7)]),
            c("index.Tensor", "f16-middle", t(7, 3, 5, dt="f16"), [None, idx(3, 2, 2)]),
            c("index.Tensor", "f32-apart", x3, [i7, None, i5]),
            c("index.Tensor", "i64-bcast", ints(7, 5),
              [idx(7, 3, 1), idx(5, 1, 4)]),
            c("index.Tensor", "b8-i32-index", b8(7, 5), [idx(7, 9, dt="i32")]),
            c("index.Tensor", "f32-0d-index", x3, [None, idx(3)])]


def _scatter_cases() -> list[Case]:
    x = t(7, 5)
    rows = perm(7, 4, 5)
    dups = idx(7, 9, 5)
    src = t(9, 5)
    return [
        c("scatter.src", "f32-dim0", x, 0, rows, src),
        c("scatter.src", "f32-dim1-t", t(5, 7, lay="t"), 1, perm(7, 5, 4, lay="t"), t(5, 7)),
        c("scatter.src", "f16", t(7, 5, dt="f16"), 0, rows, t(4, 5, dt="f16")),
        c("scatter.src", "i64-1023", ints(1023), 0, uniq(1023, 7), ints(7)),
        c("scatter.value", "f32", x, 0, rows, -1.5),
        c("scatter.value", "b8", b8(7, 5), 0, rows, True),
        c("scatter_add.default", "f32-dups", x, 0, dups, src),
        c("scatter_add.default", "i64-dups", ints(7, 5), 0, dups, ints(9, 5)),
        c("scatter_add.default", "bf16-1", t(1, 5, dt="bf16"), 0, idx(1, 3, 5), t(3, 5, dt="bf16")),
        c("scatter.reduce", "f32-add", x, 0, dups, src, reduce="add"),
        c("scatter.reduce", "f32-multiply", x, 0, dups, t(9, 5, fill="near1"), reduce="multiply"),
        c("scatter.value_reduce", "f32-multiply-narrow", x, 0, idx(7, 3, 2), 1.5, reduce="multiply"),
        c("scatter.value_reduce", "f32-add", x, 0, dups, 0.5, reduce="add"),
        c("scatter_reduce.two", "f32-sum", x, 0, dups, src, "sum"),
        c("scatter_reduce.two", "i64-amax", ints(7, 5), 0, dups, ints(9, 5), "amax"),
        c("scatter_reduce.two", "f32-amin-special-without-self", t(7, 5, fill="special"), 0, dups,
          t(9, 5, fill="special"), "amin", include_self=False),
        c("scatter_reduce.two", "f32-prod-dim1-narrow", x, 1, idx(5, 4, 3), t(6, 4, fill="near1"), "prod"),
        c("scatter_reduce.two", "f32-mean-without-self", x, 0, dups, src, "mean", include_self=False),
        c("scatter_reduce.two", "i64-mean", ints(7, 5), 1, idx(5, 7, 6), ints(7, 6), "mean"),
        c("scatter_reduce.two", "f16-amax", t(7, 5, dt="f16"), 0, dups, t(9, 5, dt="f16"), "amax"),
        c("index_reduce.default", "f32-amax-dim1", x, 1, idx(5, 8), t(7, 8, fill="special"), "amax"),
        c("index_reduce.default", "f32-mean-without-self", x, 0, idx(7, 9), t(9, 5), "mean",
          include_self=False),
        c("masked_scatter.default", "f32", x, b8(7, 5), t(40)),
        c("masked_scatter.default", "i64-bcast-mask", ints(3, 7, 5), b8(7, 1), ints(200)),
        c("masked_scatter.default", "f32-bcast-self", t(5), b8(4, 5), t(30)),
        c("index_reduce.default", "f32-0d-amax-without-self", t(), 0, idx(1, 1), t(), "amax",
          include_self=False),
        c("index_reduce.default", "i64-prod", ints(7, 5), 0, idx(7, 4), ints(4, 5), "prod"),
        c("index_reduce.default", "f32-amin-without-self", x, 0, idx(7, 3), t(3, 5), "amin",
          include_self=False),
        c("scatter_reduce.two", "f32-sum-without-self", x, 0, dups, src, "sum", include_self=False),
        c("index_put.default", "f32-unique", t(1023), [uniq(1023, 7)], t(7)),
        c("index_put.default", "f32-rows-bcast-value", x, [uniq(7, 3)], t(5)),
        c("index_put.default", "f16-accumulate", t(7, 5, dt="f16"), [idx(7, 9),
                                                                     idx(5, 9)],
          t(9, dt="f16"), True),
        c("index_put.default", "i64-neg-accumulate", ints(7), [neg(7, 9)],
          ints(1), True),
        c("index_put.default", "f32-none-falls-back", x, [None, uniq(5, 2)], t(7, 2)),
        c("index_put.default", "f32-mask-falls-back", x, [b8(7)], t(5)),
        c("_unsafe_index_put.default", "f32-accumulate", x, [idx(7, 9)], t(9, 5), True),
        c("_unsafe_index_put.default", "b8", b8(7), [uniq(7, 3)],
          b8()),
    ]


def _pool_cases() -> list[Case]:
    x = t(2, 3, 7, 9)
    return [
        c("max_pool2d.default", "f32-pad-stride", x, [3, 3], [2, 2], [1, 1]),
        c("max_pool2d.default", "f16-ceil-t", t(3, 7, 9, dt="f16", lay="t"), [2, 2], [], [0, 0], [1, 1],
          True),
        c("max_pool2d.default", "bf16-dilation", t(1, 2, 7, 7, dt="bf16"), [2, 3], [1, 2], [1, 1], [2, 1]),
        c("max_pool2d.default", "i64", ints(1, 1, 7, 5), [2, 2]),
        c("max_pool2d_with_indices.default", "f32-pad", x, [3, 3], [2, 2], [1, 1]),
        c("max_pool2d_with_indices.default", "f32-nan-ceil", t(1, 1, 7, 7, fill="special"), [2, 2], [2, 2],
          [0, 0], [1, 1], True),
        c("avg_pool2d.default", "f32-pad-exclude", x, [3, 3], [2, 2], [1, 1], False, False),
        c("avg_pool2d.default", "f16-ceil-include-t", t(3, 7, 9, dt="f16", lay="t"), [2, 2], [2, 2], [1, 1],
          True, True),
        c("avg_pool2d.default", "bf16-divisor", t(1, 2, 7, 7, dt="bf16"), [3, 3], [1, 1], [0, 0], False,
          True, 4),
        c("avg_pool2d.default", "i64-falls-back", ints(1, 1, 7, 5), [2, 2]),
        c("_adaptive_avg_pool2d.default", "f32-uneven", x, [4, 5]),
        c("_adaptive_avg_pool2d.default", "f16-1x1-t", t(3, 7, 9, dt="f16", lay="t"), [1, 1]),
        c("_adaptive_avg_pool2d.default", "bf16-same", t(1, 2, 7, 7, dt="bf16"), [7, 7]),
        c("max_pool3d_with_indices.default", "f32-pad-dilation", t(2, 5, 6, 7), [3, 2, 3], [2, 1, 2],
          [1, 1, 1], [1, 2, 1]),
        c("max_pool3d_with_indices.default", "f32-nan-ceil", t(1, 4, 5, 5, fill="special"), [2, 2, 2],
          [2, 2, 2], [0, 0, 0], [1, 1, 1], True),
        c("avg_pool3d.default", "f32-pad-exclude", t(2, 5, 6, 7), [3, 3, 2], [2, 2, 1], [1, 1, 0], False,
          False),
        c("avg_pool3d.default", "f32-ceil-include", t(1, 2, 5, 7, 6), [2, 2, 2], [2, 2, 2], [1, 1, 1],
          True, True),
        c("_adaptive_avg_pool3d.default", "f32-uneven", t(2, 5, 6, 7), [3, 4, 5]),
        c("adaptive_max_pool2d.default", "f32-uneven", x, [4, 5]),
        c("adaptive_max_pool2d.default", "f32-nan", t(1, 7, 7, fill="special"), [3, 2]),
        c("adaptive_max_pool2d.default", "bf16-1x1-t", t(3, 7, 9, dt="bf16", lay="t"), [1, 1]),
        c("adaptive_max_pool3d.default", "f32-uneven", t(2, 5, 6, 7), [3, 4, 5]),
        c("upsample_nearest2d.default", "f32-double", x, [14, 18]),
        c("upsample_nearest2d.default", "f16-odd-t", t(1, 3, 7, 5, dt="f16", lay="t"), [10, 7]),
        c("upsample_nearest2d.default", "bf16-scales", t(1, 1, 7, 5, dt="bf16"), [17, 11], 2.5, 2.25),
        c("upsample_nearest2d.vec", "f32-scale", x, None, [1.5, 3.0]),
        c("upsample_nearest2d.vec", "u8-size", t(1, 1, 7, 5, dt="u8", fill="idx:255"), [1, 1023], None),
    ]


# -- externs ---------------------------------------------------------------------------------

def _extern_cases() -> list[Case]:
    return [
        c("mm.default", "f32-t", t(7, 5), t(5, 1023, lay="t")),
        c("mm.default", "f32-1", t(1, 7), t(7, 1)),
        c("mm.default", "f32-expanded-s", t(7, 5, lay="e"), t(5, 3, lay="s")),
        c("mm.default", "bf16", t(7, 5, dt="bf16", lay="t"), t(5, 3, dt="bf16")),
        c("bmm.default", "f32", t(3, 7, 5), t(3, 5, 2, lay="t")),
        c("bmm.default", "f16", t(2, 7, 5, dt="f16"), t(2, 5, 7, dt="f16")),
        c("addmm.default", "f32-bias-row", t(1023), t(7, 5), t(5, 1023)),
        c("addmm.default", "f32-alpha-beta-t", t(7, 3), t(7, 5, lay="t"), t(5, 3), beta=0.5, alpha=2.0),
        c("addmm.default", "bf16", t(3, dt="bf16"), t(7, 5, dt="bf16"), t(5, 3, dt="bf16")),
        c("baddbmm.default", "f32", t(3, 7, 2), t(3, 7, 5), t(3, 5, 2), beta=2.0, alpha=0.5),
        c("baddbmm.default", "f32-bcast-t", t(1, 2), t(2, 7, 5, lay="t"), t(2, 5, 2)),
        c("convolution.default", "f32-2d", t(2, 3, 7, 9), t(4, 3, 3, 3), t(4), [2, 1], [1, 1], [1, 1],
          False, [0, 0], 1),
        c("convolution.default", "f32-groups-no-bias", t(1, 4, 7, 7, lay="t"), t(4, 2, 3, 3), None, [1, 1],
          [0, 0], [2, 2], False, [0, 0], 2),
        c("convolution.default", "f32-1d", t(2, 3, 1023), t(5, 3, 7), t(5), [3], [3], [1], False, [0], 1),
        c("convolution.default", "f32-transposed", t(1, 4, 5, 5), t(4, 2, 3, 3), t(2), [2, 2], [1, 1],
          [1, 1], True, [1, 1], 1),
        c("convolution.default", "bf16", t(1, 3, 7, 7, dt="bf16"), t(2, 3, 3, 3, dt="bf16"), None,
          [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
        c("scaled_dot_product_attention.default", "f32", t(2, 3, 7, 8), t(2, 3, 5, 8), t(2, 3, 5, 8)),
        c("scaled_dot_product_attention.default", "f32-causal-scale", t(1, 2, 7, 8, lay="t"),
          t(1, 2, 7, 8), t(1, 2, 7, 8), is_causal=True, scale=0.5),
        c("scaled_dot_product_attention.default", "f32-bool-mask", t(1, 2, 7, 8), t(1, 2, 5, 8),
          t(1, 2, 5, 8), t(7, 5, dt="b8", fill="ints")),
        c("scaled_dot_product_attention.default", "f32-float-mask", t(1, 2, 7, 8), t(1, 2, 5, 8),
          t(1, 2, 5, 8), t(1, 1, 7, 5)),
        c("scaled_dot_product_attention.default", "f32-gqa", t(1, 4, 7, 8), t(1, 2, 5, 8),
          t(1, 2, 5, 8), enable_gqa=True),
        c("scaled_dot_product_attention.default", "bf16", t(1, 2, 7, 8, dt="bf16"), t(1, 2, 7, 8, dt="bf16"),
          t(1, 2, 7, 8, dt="bf16")),
    ]


def _breadth_cases() -> list[Case]:
    """Ops lowered for the OpInfo breadth work: math torch has whole, view writes, scans,
    training-mode batch norm, bilinear upsampling, addmv and addbmm."""
    x3, bn = t(5, 6, 4), (t(2, 7, 3, 5), t(7), t(7), t(7), t(7, fill="pos"))
    return [
        c("_cdist_forward.default", "f32-p2-batch-broadcast", t(2, 1, 30, 4), t(3, 27, 4), 2.0, None),
        c("_cdist_forward.default", "f32-p1", t(5, 3), t(4, 3), 1.0, None),
        c("_cdist_forward.default", "f32-p0-inf", t(5, 3, fill="special"), t(4, 3), 0.0, None),
        c("_cdist_forward.default", "f32-pinf", t(2, 5, 3), t(2, 4, 3), float("inf"), None),
        c("_cdist_forward.default", "f32-p1.5-empty-features", t(5, 0), t(4, 0), 1.5, None),
        c("_cdist_forward.default", "f32-p3", t(5, 3), t(4, 3), 3.0, None),
        c("angle.default", "f32-special", t(7, 5, fill="special")),
        c("copysign.Tensor", "f32-special", t(7, 5), t(7, 5, fill="special")),
        c("copysign.Scalar", "f32", t(7, 5), -1.5),
        c("erfc.default", "f32-1023", t(1023)),
        c("special_erfc.default", "f16", t(7, 5, dt="f16")),
        c("fmax.default", "f32-special", t(7, 5, fill="special"), t(7, 5)),
        c("fmin.default", "i64", ints(7, 5), ints(7, 5)),
        c("hypot.default", "f32", t(7, 5), t(7, 5, lay="t")),
        c("ldexp.Tensor", "f32-ints", t(7, 5), ints(7, 5)),
        c("diagonal.default", "f32-offset-dims", x3, 1, 0, 2),
        c("diagonal_copy.default", "f32-negative", t(4, 5), -1),
        c("diagonal_scatter.default", "f32", x3, t(4, 5), 1, 0, 1),
        c("select_scatter.default", "f32-last", x3, t(5, 6), 2, -1),
        c("slice_scatter.default", "f32-step", x3, t(5, 3, 4), 1, 1, 6, 2),
        c("split_copy.Tensor", "f32", t(7, 5), 3, 0),
        c("unbind_copy.int", "f32", t(3, 4), 1),
        c("unfold.default", "f32", t(5, 7, 4), 1, 3, 2),
        c("unfold_copy.default", "f32-last", t(5, 7, 4), 2, 4, 1),
        c("cumsum.default", "f32", t(7, 5), 0),
        c("cumsum.default", "i64", ints(7, 5), 1),
        c("cumprod.default", "f32", t(7, 5), 1),
        c("logcumsumexp.default", "f32-special", t(7, 5, fill="special"), 1),
        c("cummax.default", "f32-special", t(7, 5, fill="special"), 0),
        c("cummax.default", "i64-ties", ints(7, 5), 1),
        c("cummin.default", "f16-halves", t(5, 9, dt="f16", fill="halves"), 1),
        c("cummin.default", "f32-special-0d", t(fill="special"), 0),
        c("bucketize.Tensor", "f32-halves", t(7, 5, fill="halves"), t(9, fill="sorted")),
        c("bucketize.Tensor", "i64-right-int32", ints(7, 5), t(6, dt="i64", fill="sorted"), right=True,
          out_int32=True),
        c("bucketize.Tensor", "f32-special", t(7, 5, fill="special"), t(4, fill="sorted")),
        c("bucketize.Scalar", "f32-scalar", 0.5, t(9, fill="sorted")),
        c("searchsorted.Tensor", "f32-rows-right", t(3, 9, fill="sorted"), t(3, 5, fill="halves"),
          right=True),
        c("searchsorted.Tensor", "f32-side-right", t(3, 8, fill="sorted"), t(3, 4, fill="halves"),
          side="right"),
        c("searchsorted.Scalar", "f64-scalar", t(9, dt="f64", fill="sorted"), 1.0),
        c("_native_batch_norm_legit_functional.default", "f32-train", *bn, True, 0.3, 1e-5),
        c("_native_batch_norm_legit_functional.default", "f32-eval", *bn, False, 0.3, 1e-5),
        c("_batch_norm_with_update_functional.default", "f32", *bn, 0.1, 1e-5),
        c("_native_batch_norm_legit.no_stats", "f32-no-affine", t(4, 7), None, None, True, 0.1, 1e-5),
        c("upsample_bilinear2d.default", "f32", t(2, 3, 5, 7), [9, 4], False),
        c("upsample_bilinear2d.vec", "f32-corners", t(2, 3, 5, 7), None, True, [2.0, 1.5]),
        c("addmv.default", "f32", t(3), t(3, 4), t(4), beta=0.5, alpha=2.0),
        c("addbmm.default", "f32", t(3, 4), t(2, 3, 5), t(2, 5, 4)),
    ]


CASES = [*_unary_cases(), *_binary_cases(), *_div_pow_cases(), *_select_cases(), *_copy_cases(),
         *_fill_cases(), *_view_cases(), *_no_op_cases(), *_reduction_cases(), *_statistics_cases(),
         *_norm_cases(), *_cat_pad_cases(), *_gather_cases(), *_index_cases(), *_scatter_cases(),
         *_pool_cases(), *_extern_cases(), *_breadth_cases()]
# Higher-order ops lower whole subgraphs, so they are tested on exported programs elsewhere.
EXCLUDED = {"higher_order.cond": "higher-order op: lowers subgraphs, tested through torch.export",
            "higher_order.while_loop": "higher-order op: lowers subgraphs, tested through torch.export",
            "higher_order.with_effects": "higher-order op: an effect token, tested through torch.export "
                                         "(test_compile_api, test_lower_regressions)"}


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_lowering_matches_eager(case: Case) -> None:
    g = torch.Generator().manual_seed(zlib.crc32(case.id.encode()))
    args, kwargs = materialize(case.args, g), materialize(case.kwargs, g)
    check_lowering(fallback_op(case.target), args, kwargs, case.tolerance, not case.shapes_only)


def test_every_lowering_has_a_case() -> None:
    covered = {case.target for case in CASES}
    missing = sorted(set(LOWERINGS) - covered - set(EXCLUDED))
    assert not missing, f"lowerings without a numeric case in tests/test_lowerings.py: {missing}"
    unknown = sorted(covered - set(LOWERINGS))
    assert not unknown, f"cases for ops the table does not lower: {unknown}"


def test_case_ids_are_unique() -> None:
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
