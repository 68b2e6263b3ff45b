"""Pooling and nearest upsampling: windows as reductions, upsampling as a gather.

A 2-d pool loops i0.. over the batch dims and the output plane, and r0, r1 over the window.
Window positions outside the input are `masked` loads (max reads -inf there, sum reads 0), so
no load is out of bounds, and a window that never leaves the input has no mask at all. The
leading dims (N, C or just C) are batch: the last two are the plane.

Note: every lowering here follows the CPU kernels in ATen (MaxPoolKernel.cpp,
AvgPoolKernel.cpp, AdaptiveAvgPoolKernel.cpp, UpSampleKernel.cpp), which CUDA's agree with: a
window's bounds, the divisor of an average, NaN handling and the float arithmetic of nearest
indexing are all theirs. Output sizes (ceil_mode included) come from the call's meta, which is
torch's own shape function.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import reduce
from typing import Any

import torch

from tasks.ir import index as ix
from tasks.ir.dtypes import DType
from tasks.ir.expr import Expr, Op, binary, cast, const, masked, unary, where
from tasks.ir.nodes import ReduceOp
from tasks.lower.context import Call, Lower
from tasks.lower.reductions import to_dtype
from tasks.lower.registry import lower_fallback, register
from tasks.lower.values import Loop, TensorValue


def _pair(value: Any, default: Any = None) -> tuple[int, int]:
    """An int[2] argument: one int, [k] or [kh, kw]; an empty list takes `default`."""
    if isinstance(value, int):
        return value, value
    items = list(value)
    if not items:
        return _pair(default)
    return (int(items[0]), int(items[-1]))


def _and(conds: list[Expr]) -> Expr:
    return reduce(lambda a, b: binary(Op.LOGICAL_AND, a, b), conds)


def _inside(i: Expr, size: int, ranges: ix.Ranges) -> list[Expr]:
    """Conditions for 0 <= i < size, leaving out the ones i's bounds already keep."""
    lo, hi = ix.bounds(i, ranges)
    conds = []
    if lo < 0:
        conds.append(binary(Op.GE, i, ix.const(0)))
    if hi >= size:
        conds.append(binary(Op.LT, i, ix.const(size)))
    return conds


def _lowest(dtype: DType) -> Expr:
    """The value below every element: what max reads outside the input."""
    if dtype.is_float:
        return const(float("-inf"), dtype)
    if dtype is DType.U8:
        return const(0, dtype)
    return const(-(1 << (8 * dtype.itemsize - 1)), dtype)


# -- windows ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sliding:
    """One axis of a sliding window: input position o*stride - pad + r*dilation, r < kernel."""

    size: int
    kernel: int
    stride: int
    pad: int
    dilation: int = 1

    def start(self, o: Expr) -> Expr:
        return ix.add(ix.scale(o, self.stride), ix.const(-self.pad))

    def at(self, o: Expr, r: Expr, ranges: ix.Ranges) -> tuple[Expr, list[Expr]]:
        i = ix.add(self.start(o), ix.scale(r, self.dilation))
        return i, _inside(i, self.size, ranges)


@dataclass(frozen=True)
class Adaptive:
    """One axis of an adaptive window: [floor(o*size/out), ceil((o+1)*size/out))."""

    size: int
    out: int

    def bounds(self, o: int) -> tuple[int, int]:
        return o * self.size // self.out, -(-(o + 1) * self.size // self.out)

    @property
    def counts(self) -> list[int]:
        return [hi - lo for lo, hi in map(self.bounds, range(self.out))]

    @property
    def kernel(self) -> int:
        return max(self.counts)

    def start(self, o: Expr, ranges: ix.Ranges) -> Expr:
        return ix.floordiv(ix.scale(o, self.size), self.out, ranges)

    def end(self, o: Expr, ranges: ix.Ranges) -> Expr:
        top = ix.add(ix.scale(o, self.size), ix.const(self.size + self.out - 1))
        return ix.floordiv(top, self.out, ranges)

    def count(self, o: Expr, ranges: ix.Ranges) -> Expr:
        return ix.add(self.end(o, ranges), ix.scale(self.start(o, ranges), -1))

    def at(self, o: Expr, r: Expr, ranges: ix.Ranges) -> tuple[Expr, list[Expr]]:
        i = ix.add(self.start(o, ranges), r)
        if min(self.counts) == self.kernel:
            return i, []
        return i, [binary(Op.LT, i, self.end(o, ranges))]


Axis = Sliding | Adaptive
Value = Callable[[Expr, Loop], Expr]


def _window(ctx: Lower, x: TensorValue, out_hw: tuple[int, int], axes: tuple[Axis, Axis],
            op: ReduceOp, outside: Expr, origin: str, value: Value | None = None) -> TensorValue:
    """Reduce each window of x's plane (loaded in compute type, `outside` off the input)."""
    shape = (*x.shape[:-2], *out_hw)

    def body(loop: Loop) -> Expr:
        *batch, oh, ow = loop.idx
        ih, conds_h = axes[0].at(oh, loop.ridx[0], loop.ranges)
        iw, conds_w = axes[1].at(ow, loop.ridx[1], loop.ranges)
        element = cast(loop.load(x, (*batch, ih, iw)), x.dtype.compute)
        conds = conds_h + conds_w
        if conds:
            element = masked(_and(conds), element, outside)
        return value(element, loop) if value else element

    (out,) = ctx.reduction(op, shape, (axes[0].kernel, axes[1].kernel), origin, body)
    return out


def _out_hw(call: Call, index: int = 0) -> tuple[int, int]:
    metas = call.out if isinstance(call.out, tuple) else (call.meta,)
    meta = metas[index]
    assert meta is not None
    return meta.shape[-2], meta.shape[-1]


# -- max pool --------------------------------------------------------------------------------

def _max_axes(call: Call, x: TensorValue) -> tuple[Sliding, Sliding]:
    kernel = _pair(call["kernel_size"])
    stride = _pair(call["stride"], kernel)
    pad, dilation = _pair(call["padding"]), _pair(call["dilation"])
    return (Sliding(x.shape[-2], kernel[0], stride[0], pad[0], dilation[0]),
            Sliding(x.shape[-1], kernel[1], stride[1], pad[1], dilation[1]))


@register("aten.max_pool2d.default")
def _max_pool2d(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    axes = _max_axes(call, x)
    values = _window(ctx, x, _out_hw(call), axes, ReduceOp.MAX, _lowest(x.dtype.compute), call.origin)
    return to_dtype(ctx, values, x.dtype, call.origin)


@register("aten.max_pool2d_with_indices.default")
def _max_pool2d_with_indices(ctx: Lower, call: Call) -> tuple[TensorValue, TensorValue]:
    x = call.tensor("self")
    axes = _max_axes(call, x)
    out_hw, lowest = _out_hw(call), _lowest(x.dtype.compute)
    values = _window(ctx, x, out_hw, axes, ReduceOp.MAX, lowest, call.origin)
    first = _window(ctx, x, out_hw, axes, ReduceOp.ARGMAX, lowest, call.origin)
    last_nan = None
    if x.dtype.is_float:
        last_nan = _window(ctx, x, out_hw, axes, ReduceOp.MAX, lowest, call.origin,
                           lambda e, loop: where(unary(Op.ISNAN, e), _flat_r(loop, axes), ix.const(-1)))
    indices = _input_index(ctx, first, last_nan, axes, x.shape[-1], call.origin)
    return to_dtype(ctx, values, x.dtype, call.origin), indices


def _flat_r(loop: Loop, axes: tuple[Sliding, Sliding]) -> Expr:
    return ix.add(ix.scale(loop.ridx[0], axes[1].kernel), loop.ridx[1])


# Note: torch keeps the first maximum of a window (a strict >), but a NaN always replaces the
# running maximum, so a window with NaNs points at its last NaN. ARGMAX gives the first
# maximum (NaN counting as the largest), so a second reduction finds the last NaN, if any.
# ARGMAX can also land on a padding position when every element of the window is the
# lowest value (all -inf): torch then points at the window's first position inside the
# input, and so does the fix-up in `_window_position`.

def _input_index(ctx: Lower, first: TensorValue, last_nan: TensorValue | None,
                 axes: tuple[Sliding, Sliding], width: int, origin: str) -> TensorValue:
    """The flat h*W + w input position of each window's chosen element."""
    def body(loop: Loop) -> Expr:
        *_, oh, ow = loop.idx
        pos = loop.load(first, loop.idx)
        if last_nan is not None:
            nan = loop.load(last_nan, loop.idx)
            pos = where(binary(Op.GE, nan, ix.const(0)), nan, pos)
        kh = ix.floordiv(pos, axes[1].kernel, loop.ranges)
        kw = ix.mod(pos, axes[1].kernel, loop.ranges)
        ih = _window_position(axes[0], oh, kh, loop.ranges)
        iw = _window_position(axes[1], ow, kw, loop.ranges)
        return ix.add(ix.scale(ih, width), iw)

    return ctx.pointwise(first.shape, DType.I64, origin, body)


def _window_position(axis: Sliding, o: Expr, k: Expr, ranges: ix.Ranges) -> Expr:
    start = axis.start(o)
    i = ix.add(start, ix.scale(k, axis.dilation))
    if ix.bounds(start, ranges)[0] >= 0:
        return i
    d = axis.dilation
    # the first position start + j*d >= 0: j = ceil(-start / d)
    inside = ix.const(0) if d == 1 else ix.add(
        start, ix.scale(ix.floordiv(ix.add(ix.scale(start, -1), ix.const(d - 1)), d, ranges), d))
    return where(binary(Op.LT, i, ix.const(0)), inside, i)


# -- average pools ---------------------------------------------------------------------------

@register("aten.avg_pool2d.default")
def _avg_pool2d(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    if not x.dtype.is_float:
        fallback: TensorValue = lower_fallback(ctx, call)
        return fallback  # integer averages truncate; rare enough to leave to aten
    kernel = _pair(call["kernel_size"])
    stride, pad = _pair(call["stride"], kernel), _pair(call["padding"])
    axes = (Sliding(x.shape[-2], kernel[0], stride[0], pad[0]),
            Sliding(x.shape[-1], kernel[1], stride[1], pad[1]))
    out_hw = _out_hw(call)
    acc = x.dtype.compute
    total = _window(ctx, x, out_hw, axes, ReduceOp.SUM, const(0, acc), call.origin)
    override, include_pad = call["divisor_override"], bool(call["count_include_pad"])

    def body(loop: Loop) -> Expr:
        *_, oh, ow = loop.idx
        if override is not None:
            divisor = const(override, acc)
        else:
            count = _product(_avg_count(axes[0], out_hw[0], oh, include_pad),
                             _avg_count(axes[1], out_hw[1], ow, include_pad))
            divisor = cast(count, acc)
        return binary(Op.TRUEDIV, loop.load(total, loop.idx), divisor)

    return ctx.pointwise(total.shape, call.meta.dtype, call.origin, body)


def _product(a: Expr, b: Expr) -> Expr:
    if a.op is Op.CONST and b.op is Op.CONST:
        return ix.const(int(a.arg) * int(b.arg))  # type: ignore[arg-type]
    return binary(Op.MUL, a, b)


# Note: torch's divisor for a window [start, start + kernel) is, with count_include_pad, its
# part inside [-pad, size + pad) (a ceil_mode window can hang past that), and without, its
# part inside [0, size). Both are worked out per output position here, and the min and max
# are only emitted where some window needs them, so a plain pool divides by a constant.

def _avg_count(axis: Sliding, out: int, o: Expr, include_pad: bool) -> Expr:
    """The number of positions of window o that count towards its average."""
    low, high = (-axis.pad, axis.size + axis.pad) if include_pad else (0, axis.size)
    starts = [k * axis.stride - axis.pad for k in range(out)]
    counts = {min(s + axis.kernel, high) - max(s, low) for s in starts}
    if len(counts) == 1:
        return ix.const(counts.pop())
    start = axis.start(o)
    end = ix.add(start, ix.const(axis.kernel))
    if any(s + axis.kernel > high for s in starts):
        end = binary(Op.MINIMUM, end, ix.const(high))
    if any(s < low for s in starts):
        start = binary(Op.MAXIMUM, start, ix.const(low))
    return ix.add(end, ix.scale(start, -1))


@register("aten._adaptive_avg_pool2d.default")
def _adaptive_avg_pool2d(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    out_hw = _out_hw(call)
    axes = (Adaptive(x.shape[-2], out_hw[0]), Adaptive(x.shape[-1], out_hw[1]))
    acc = x.dtype.compute
    total = _window(ctx, x, out_hw, axes, ReduceOp.SUM, const(0, acc), call.origin)

    def body(loop: Loop) -> Expr:
        # as torch: sum / kh / kw, in that order
        out = loop.load(total, loop.idx)
        for axis, o in zip(axes, loop.idx[-2:], strict=True):
            counts = set(axis.counts)
            count = ix.const(counts.pop()) if len(counts) == 1 else axis.count(o, loop.ranges)
            out = binary(Op.TRUEDIV, out, cast(count, acc))
        return out

    return ctx.pointwise(total.shape, call.meta.dtype, call.origin, body)


# -- nearest upsampling ----------------------------------------------------------------------

@register("aten.upsample_nearest2d.vec", "aten.upsample_nearest2d.default")
def _upsample_nearest2d(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("input" if "input" in call.args else "self")
    out_hw = _out_hw(call)
    if call.target.endswith(".vec"):
        factors = call["scale_factors"]
        scales: list[float | None] = list(factors) if factors else [None, None]
    else:
        scales = [call["scales_h"], call["scales_w"]]
    axes = [_nearest(x.shape[-2 + k], out_hw[k], scales[k]) for k in range(2)]

    def body(loop: Loop) -> Expr:
        *batch, oh, ow = loop.idx
        return loop.load(x, (*batch, axes[0](oh, loop.ranges), axes[1](ow, loop.ranges)))

    return ctx.pointwise(call.meta.shape, call.meta.dtype, call.origin, body)


# Note: torch's nearest source index is min(floor(float(o) * scale), size - 1) in fp32, with
# scale = 1/scale_factor when one is given and size/out otherwise, except that out == size
# copies and out == 2*size halves exactly. fp32 rounding can make that differ from the exact
# floor(o * size / out), so the table is computed here the way torch does it, and the exact
# integer form is used only where it gives the same table; otherwise the body does torch's
# fp32 arithmetic itself.

def _nearest(size: int, out: int, scale: float | None) -> Callable[[Expr, ix.Ranges], Expr]:
    """The input position each output position o reads along one axis."""
    g = math.gcd(size, out)
    if _nearest_table(size, out, scale) == [o * size // out for o in range(out)]:
        return lambda o, ranges: ix.floordiv(ix.scale(o, size // g), out // g, ranges)
    ratio = _fp32_scale(size, out, scale)

    def fp32(o: Expr, _ranges: ix.Ranges) -> Expr:
        f = unary(Op.FLOOR, binary(Op.MUL, cast(o, DType.F32), const(ratio, DType.F32)))
        return binary(Op.MINIMUM, cast(f, DType.I64), ix.const(size - 1))

    return fp32


def _fp32_scale(size: int, out: int, scale: float | None) -> float:
    if scale is not None and scale > 0:
        return float(torch.tensor(1.0 / scale, dtype=torch.float32))
    return float(torch.tensor(size, dtype=torch.float32) / torch.tensor(out, dtype=torch.float32))


def _nearest_table(size: int, out: int, scale: float | None) -> list[int]:
    if out == size:
        return list(range(out))
    if out == 2 * size:
        return [o // 2 for o in range(out)]
    ratio = torch.tensor(_fp32_scale(size, out, scale), dtype=torch.float32)
    positions = (torch.arange(out).to(torch.float32) * ratio).floor().to(torch.int64)
    return [int(p) for p in positions.clamp(max=size - 1).tolist()]


# -- bilinear upsampling ---------------------------------------------------------------------

@register("aten.upsample_bilinear2d.vec", "aten.upsample_bilinear2d.default")
def _upsample_bilinear2d(ctx: Lower, call: Call) -> TensorValue:
    """Each output the blend of its four nearest inputs, as torch's kernel computes it in fp32:
    source = (o + 0.5) * scale - 0.5, clamped at 0 (or o * (in - 1) / (out - 1) with
    align_corners), its floor and the next index, weighted by the fraction."""
    x = call.tensor("input" if "input" in call.args else "self")
    out_hw = _out_hw(call)
    if call.target.endswith(".vec"):
        factors = call["scale_factors"]
        scales: list[float | None] = list(factors) if factors else [None, None]
    else:
        scales = [call.args.get("scales_h"), call.args.get("scales_w")]
    corners = bool(call["align_corners"])
    acc = x.dtype.compute
    axes = [_bilinear_axis(x.shape[-2 + k], out_hw[k], scales[k], corners, acc) for k in range(2)]

    def body(loop: Loop) -> Expr:
        *batch, oh, ow = loop.idx
        (h0, h1, lh), (w0, w1, lw) = axes[0](oh), axes[1](ow)

        def at(h: Expr, w: Expr) -> Expr:
            return cast(loop.load(x, (*batch, h, w)), acc)

        top = _lerp(at(h0, w0), at(h0, w1), lw)
        bottom = _lerp(at(h1, w0), at(h1, w1), lw)
        return _lerp(top, bottom, lh)

    return ctx.pointwise(call.meta.shape, call.meta.dtype, call.origin, body)


def _lerp(a: Expr, b: Expr, t: Expr) -> Expr:
    """a * (1 - t) + b * t, as torch's bilinear kernel weighs its two neighbours."""
    one = const(1.0, t.dtype)
    return binary(Op.ADD, binary(Op.MUL, a, binary(Op.SUB, one, t)), binary(Op.MUL, b, t))


def _bilinear_axis(size: int, out: int, scale: float | None, corners: bool,
                   acc: DType) -> Callable[[Expr], tuple[Expr, Expr, Expr]]:
    """For an output position: the lower and upper input positions and the upper's weight."""
    if corners:
        ratio = (size - 1) / (out - 1) if out > 1 else 0.0
    else:
        ratio = 1.0 / scale if scale is not None and scale > 0 else size / out

    def axis(o: Expr) -> tuple[Expr, Expr, Expr]:
        position = cast(o, acc)
        if corners:
            source = binary(Op.MUL, const(ratio, acc), position)
        else:
            centre = binary(Op.ADD, position, const(0.5, acc))
            source = binary(Op.SUB, binary(Op.MUL, const(ratio, acc), centre), const(0.5, acc))
            source = binary(Op.MAXIMUM, source, const(0.0, acc))
        low = binary(Op.MINIMUM, cast(unary(Op.FLOOR, source), DType.I64), ix.const(size - 1))
        high = binary(Op.MINIMUM, binary(Op.ADD, low, ix.const(1)), ix.const(size - 1))
        weight = binary(Op.SUB, source, cast(low, acc))
        return low, high, weight

    return axis
