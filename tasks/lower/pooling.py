"""Pooling and nearest upsampling: windows as reductions, upsampling as a gather.

A 2-d pool loops i0.. over the batch dims and the output plane, and r0, r1 over the window (a
3-d pool: its volume, and r0, r1, r2). Window positions outside the input are `masked` loads
(max reads -inf there, sum reads 0), so no load is out of bounds, and a window that never
leaves the input has no mask at all. The leading dims (N, C or just C) are batch: the last
two (or three) are pooled.

Note: every lowering here follows the CPU kernels in ATen (MaxPoolKernel.cpp, AvgPoolKernel.cpp,
AdaptiveAvgPoolKernel.cpp, AdaptiveMaxPoolKernel.cpp, UpSampleKernel.cpp), which CUDA's agree
with: a window's bounds, the divisor of an average, NaN handling and the float arithmetic of
nearest indexing are all theirs. Output sizes (ceil_mode included) come from the call's meta, which is
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
from tasks.lower.reductions import extreme, to_dtype
from tasks.lower.registry import lower_fallback, register
from tasks.lower.values import Loop, TensorValue


def _ints(value: Any, n: int, default: Any = None) -> tuple[int, ...]:
    """An int[n] argument: one int, [k] or [k0, .., kn-1]; an empty list takes `default`."""
    if isinstance(value, int):
        return (value,) * n
    items = [int(v) for v in value]
    if not items:
        return _ints(default, n)
    return tuple(items) if len(items) == n else (items[0],) * n


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
    return extreme(dtype, top=False)


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

    def position(self, o: Expr, k: Expr, ranges: ix.Ranges) -> Expr:
        """The input position of window o's k-th element, or of its first one inside the input
        where k lands on padding (what torch's index points at when no element beats -inf)."""
        start = self.start(o)
        i = ix.add(start, ix.scale(k, self.dilation))
        if ix.bounds(start, ranges)[0] >= 0:
            return i
        d = self.dilation
        # the first position start + j*d >= 0: j = ceil(-start / d)
        inside = ix.const(0) if d == 1 else ix.add(
            start, ix.scale(ix.floordiv(ix.add(ix.scale(start, -1), ix.const(d - 1)), d, ranges), d))
        return where(binary(Op.LT, i, ix.const(0)), inside, i)


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

    def position(self, o: Expr, k: Expr, ranges: ix.Ranges) -> Expr:
        return ix.add(self.start(o, ranges), k)  # the first element is always inside


Axis = Sliding | Adaptive
Value = Callable[[Expr, Loop], Expr]


def _window(ctx: Lower, x: TensorValue, out_sizes: tuple[int, ...], axes: tuple[Axis, ...],
            op: ReduceOp, outside: Expr, origin: str, value: Value | None = None) -> TensorValue:
    """Reduce each window of x's last len(axes) dims (loaded in compute type, `outside` off the
    input)."""
    n = len(axes)
    shape = (*x.shape[:-n], *out_sizes)

    def body(loop: Loop) -> Expr:
        positions, conds = [], []
        for axis, o, r in zip(axes, loop.idx[-n:], loop.ridx, strict=True):
            i, inside = axis.at(o, r, loop.ranges)
            positions.append(i)
            conds += inside
        element = cast(loop.load(x, (*loop.idx[:-n], *positions)), x.dtype.compute)
        if conds:
            element = masked(_and(conds), element, outside)
        return value(element, loop) if value else element

    (out,) = ctx.reduction(op, shape, tuple(axis.kernel for axis in axes), origin, body)
    return out


def _out_sizes(call: Call, n: int, index: int = 0) -> tuple[int, ...]:
    metas = call.out if isinstance(call.out, tuple) else (call.meta,)
    meta = metas[index]
    assert meta is not None
    return tuple(meta.shape[-n:])


# -- max pool --------------------------------------------------------------------------------

def _max_axes(call: Call, x: TensorValue, n: int) -> tuple[Sliding, ...]:
    kernel = _ints(call["kernel_size"], n)
    stride = _ints(call["stride"], n, kernel)
    pad, dilation = _ints(call["padding"], n), _ints(call["dilation"], n)
    return tuple(Sliding(x.shape[k - n], kernel[k], stride[k], pad[k], dilation[k]) for k in range(n))


@register("aten.max_pool2d.default")
def _max_pool2d(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    axes = _max_axes(call, x, 2)
    values = _window(ctx, x, _out_sizes(call, 2), axes, ReduceOp.MAX, _lowest(x.dtype.compute), call.origin)
    return to_dtype(ctx, values, x.dtype, call.origin)


@register("aten.max_pool2d_with_indices.default")
def _max_pool2d_with_indices(ctx: Lower, call: Call) -> tuple[TensorValue, TensorValue]:
    x = call.tensor("self")
    return _max_with_indices(ctx, call, x, _max_axes(call, x, 2))


@register("aten.max_pool3d_with_indices.default")
def _max_pool3d_with_indices(ctx: Lower, call: Call) -> tuple[TensorValue, TensorValue]:
    x = call.tensor("self")
    return _max_with_indices(ctx, call, x, _max_axes(call, x, 3))


@register("aten.adaptive_max_pool2d.default", "aten.adaptive_max_pool3d.default")
def _adaptive_max_pool(ctx: Lower, call: Call) -> tuple[TensorValue, TensorValue]:
    x = call.tensor("self")
    n = 3 if "3d" in call.target else 2
    if not x.dtype.is_float:
        fallback: tuple[TensorValue, TensorValue] = lower_fallback(ctx, call)
        return fallback
    out = _out_sizes(call, n)
    return _max_with_indices(ctx, call, x, tuple(Adaptive(x.shape[k - n], out[k]) for k in range(n)))


def _max_with_indices(ctx: Lower, call: Call, x: TensorValue,
                      axes: tuple[Axis, ...]) -> tuple[TensorValue, TensorValue]:
    """Each window's maximum, and the flat input position (over the pooled dims) it came from."""
    out, lowest = _out_sizes(call, len(axes)), _lowest(x.dtype.compute)
    values = _window(ctx, x, out, axes, ReduceOp.MAX, lowest, call.origin)
    first = _window(ctx, x, out, axes, ReduceOp.ARGMAX, lowest, call.origin)
    last_nan = None
    if x.dtype.is_float:
        last_nan = _window(ctx, x, out, axes, ReduceOp.MAX, lowest, call.origin,
                           lambda e, loop: where(unary(Op.ISNAN, e), _flat_r(loop, axes), ix.const(-1)))
    indices = _input_index(ctx, first, last_nan, axes, x.shape[-len(axes):], call.origin)
    return to_dtype(ctx, values, x.dtype, call.origin), indices


def _flat_r(loop: Loop, axes: tuple[Axis, ...]) -> Expr:
    flat = loop.ridx[0]
    for axis, r in zip(axes[1:], loop.ridx[1:], strict=True):
        flat = ix.add(ix.scale(flat, axis.kernel), r)
    return flat


# Note: torch keeps the first maximum of a window (a strict >), but a NaN always replaces the
# running maximum, so a window with NaNs points at its last NaN. ARGMAX gives the first
# maximum (NaN counting as the largest), so a second reduction finds the last NaN, if any.
# ARGMAX can also land on a padding position when every element of the window is the
# lowest value (all -inf): torch then points at the window's first position inside the
# input, and so does the fix-up in `Sliding.position`. Adaptive max pools (2-d and 3-d) and
# 3-d max pools choose their element the same way in ATen.

def _input_index(ctx: Lower, first: TensorValue, last_nan: TensorValue | None,
                 axes: tuple[Axis, ...], sizes: tuple[int, ...], origin: str) -> TensorValue:
    """The flat (d*H + h)*W + w input position of each window's chosen element."""
    n = len(axes)

    def body(loop: Loop) -> Expr:
        pos = loop.load(first, loop.idx)
        if last_nan is not None:
            nan = loop.load(last_nan, loop.idx)
            pos = where(binary(Op.GE, nan, ix.const(0)), nan, pos)
        ks: list[Expr] = []
        for axis in reversed(axes[1:]):  # the window's flat position, split per axis
            ks.insert(0, ix.mod(pos, axis.kernel, loop.ranges))
            pos = ix.floordiv(pos, axis.kernel, loop.ranges)
        ks.insert(0, pos)
        flat: Expr = ix.const(0)
        for axis, o, k, size in zip(axes, loop.idx[-n:], ks, sizes, strict=True):
            flat = ix.add(ix.scale(flat, size), axis.position(o, k, loop.ranges))
        return flat

    return ctx.pointwise(first.shape, DType.I64, origin, body)


# -- average pools ---------------------------------------------------------------------------

@register("aten.avg_pool2d.default", "aten.avg_pool3d.default")
def _avg_pool(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    if not x.dtype.is_float:
        fallback: TensorValue = lower_fallback(ctx, call)
        return fallback  # integer averages truncate; rare enough to leave to aten
    n = 3 if "3d" in call.target else 2
    kernel = _ints(call["kernel_size"], n)
    stride, pad = _ints(call["stride"], n, kernel), _ints(call["padding"], n)
    axes = tuple(Sliding(x.shape[k - n], kernel[k], stride[k], pad[k]) for k in range(n))
    out = _out_sizes(call, n)
    acc = x.dtype.compute
    total = _window(ctx, x, out, axes, ReduceOp.SUM, const(0, acc), call.origin)
    override, include_pad = call["divisor_override"], bool(call["count_include_pad"])

    def body(loop: Loop) -> Expr:
        if override is not None:
            divisor = const(override, acc)
        else:
            counts = [_avg_count(axis, size, o, include_pad)
                      for axis, size, o in zip(axes, out, loop.idx[-n:], strict=True)]
            divisor = cast(reduce(_product, counts), acc)
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


@register("aten._adaptive_avg_pool2d.default", "aten._adaptive_avg_pool3d.default")
def _adaptive_avg_pool(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    n = 3 if "3d" in call.target else 2
    out = _out_sizes(call, n)
    axes = tuple(Adaptive(x.shape[k - n], out[k]) for k in range(n))
    acc = x.dtype.compute
    total = _window(ctx, x, out, axes, ReduceOp.SUM, const(0, acc), call.origin)

    def body(loop: Loop) -> Expr:
        # as torch: sum / kd / kh / kw, in that order
        value = loop.load(total, loop.idx)
        for axis, o in zip(axes, loop.idx[-n:], strict=True):
            counts = set(axis.counts)
            count = ix.const(counts.pop()) if len(counts) == 1 else axis.count(o, loop.ranges)
            value = binary(Op.TRUEDIV, value, cast(count, acc))
        return value

    return ctx.pointwise(total.shape, call.meta.dtype, call.origin, body)


# -- nearest upsampling ----------------------------------------------------------------------

@register("aten.upsample_nearest2d.vec", "aten.upsample_nearest2d.default")
def _upsample_nearest2d(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("input" if "input" in call.args else "self")
    out_hw = _out_sizes(call, 2)
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
    out_hw = _out_sizes(call, 2)
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
