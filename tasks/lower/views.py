"""View and layout ops: each builds a new index map over the same buffer and emits no node.

A view is given as `old_index`: the input's indices as expressions of the output's variables
v0..vm. `TensorValue.reindex` composes and simplifies, so a chain of views is one index
expression in whatever consumes it.
"""

from __future__ import annotations

from typing import Any

from tasks.ir import index as ix
from tasks.ir.expr import Expr
from tasks.lower.context import Call, Lower, LoweringError
from tasks.lower.registry import lower_fallback, register
from tasks.lower.values import TensorValue, view_var


def _vars(n: int) -> list[Expr]:
    return [view_var(k) for k in range(n)]


def _dim(d: int, ndim: int) -> int:
    n = max(ndim, 1)
    if not -n <= d < n:
        raise LoweringError(f"dimension {d} out of range for a {ndim}-d tensor")
    return d % n


def reshape(x: TensorValue, shape: tuple[int, ...]) -> TensorValue:
    shape = _infer_shape(shape, x.numel)
    if shape == x.shape:
        return x
    new = _vars(len(shape))
    ranges = {f"v{k}": s for k, s in enumerate(shape)}
    flat = ix.flatten_index(tuple(new), shape)
    return x.reindex(shape, ix.unflatten_index(flat, x.shape, ranges))


def _infer_shape(shape: tuple[int, ...], numel: int) -> tuple[int, ...]:
    if -1 not in shape:
        return tuple(shape)
    known = 1
    for s in shape:
        known *= s if s != -1 else 1
    return tuple(numel // known if s == -1 else s for s in shape)


@register("aten.view.default", "aten._unsafe_view.default", "aten.view_copy.default")
def _view(ctx: Lower, call: Call) -> TensorValue:
    return reshape(call.tensor("self"), tuple(call["size"]))


@register("aten.reshape.default")
def _reshape(ctx: Lower, call: Call) -> TensorValue:
    return reshape(call.tensor("self"), tuple(call["shape"]))


@register("aten.alias.default", "aten.alias_copy.default", "aten.lift_fresh.default")
def _alias(ctx: Lower, call: Call) -> TensorValue:
    return call.tensor("self")


def permute(x: TensorValue, dims: list[int]) -> TensorValue:
    dims = [_dim(d, x.ndim) for d in dims]
    old: list[Expr] = [view_var(0)] * x.ndim
    for new_pos, old_pos in enumerate(dims):
        old[old_pos] = view_var(new_pos)
    return x.reindex(tuple(x.shape[d] for d in dims), tuple(old))


@register("aten.permute.default", "aten.permute_copy.default")
def _permute(ctx: Lower, call: Call) -> TensorValue:
    return permute(call.tensor("self"), list(call["dims"]))


@register("aten.numpy_T.default")
def _numpy_t(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    return permute(x, list(reversed(range(x.ndim))))


@register("aten.transpose.int", "aten.t.default")
def _transpose(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    if x.ndim < 2:
        return x
    d0, d1 = (call["dim0"], call["dim1"]) if "dim0" in call.args else (0, 1)
    dims = list(range(x.ndim))
    d0, d1 = _dim(d0, x.ndim), _dim(d1, x.ndim)
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return permute(x, dims)


def expand(x: TensorValue, shape: tuple[int, ...]) -> TensorValue:
    lead = len(shape) - x.ndim
    shape = tuple(x.shape[k - lead] if s == -1 else s for k, s in enumerate(shape))
    old = tuple(ix.const(0) if size == 1 and shape[lead + k] != 1 else view_var(lead + k)
                for k, size in enumerate(x.shape))
    return x.reindex(shape, old)


@register("aten.expand.default", "aten.expand_copy.default")
def _expand(ctx: Lower, call: Call) -> TensorValue:
    return expand(call.tensor("self"), tuple(call["size"]))


@register("aten.unsqueeze.default", "aten.unsqueeze_copy.default")
def _unsqueeze(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    d = _dim(call["dim"], x.ndim + 1)
    shape = (*x.shape[:d], 1, *x.shape[d:])
    new = _vars(len(shape))
    return x.reindex(shape, tuple(new[:d] + new[d + 1:]))


@register("aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default", "aten.squeeze_copy.dims")
def _squeeze(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    dims = call.args.get("dim", list(range(x.ndim)))
    dims = {_dim(d, x.ndim) for d in ([dims] if isinstance(dims, int) else dims)}
    drop = {d for d in dims if x.ndim and x.shape[d] == 1}
    shape = tuple(s for k, s in enumerate(x.shape) if k not in drop)
    new = iter(_vars(len(shape)))
    return x.reindex(shape, tuple(ix.const(0) if k in drop else next(new) for k in range(x.ndim)))


def slice_dim(x: TensorValue, dim: int, start: int | None, end: int | None, step: int) -> TensorValue:
    dim = _dim(dim, x.ndim)
    size = x.shape[dim]
    lo, hi, _ = slice(start, end, step).indices(size)
    length = max(0, (hi - lo + step - 1) // step)
    shape = (*x.shape[:dim], length, *x.shape[dim + 1:])
    old = _vars(len(shape))
    old[dim] = ix.add(ix.scale(view_var(dim), step), ix.const(lo))
    return x.reindex(shape, tuple(old))


@register("aten.slice.Tensor", "aten.slice_copy.Tensor")
def _slice(ctx: Lower, call: Call) -> TensorValue:
    return slice_dim(call.tensor("self"), call["dim"], call["start"], call["end"], call["step"])


@register("aten.narrow.default")
def _narrow(ctx: Lower, call: Call) -> TensorValue:
    x, dim, start = call.tensor("self"), call["dim"], call["start"]
    if start < 0:  # counts from the end; as a slice, start:start+length is empty once it reaches 0
        start += x.shape[_dim(dim, x.ndim)]
    return slice_dim(x, dim, start, start + call["length"], 1)


@register("aten.select.int", "aten.select_copy.int")
def _select(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    dim = _dim(call["dim"], x.ndim)
    i = call["index"] % x.shape[dim]
    shape = x.shape[:dim] + x.shape[dim + 1:]
    new = _vars(len(shape))
    return x.reindex(shape, (*new[:dim], ix.const(i), *new[dim:]))


@register("aten.diagonal.default", "aten.diagonal_copy.default")
def _diagonal(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    offset = call.args.get("offset", 0)
    d1, d2 = _dim(call.args.get("dim1", 0), x.ndim), _dim(call.args.get("dim2", 1), x.ndim)
    if d1 == d2:
        raise LoweringError(f"diagonal dimensions cannot be identical {d1}, {d2}")
    row, col = max(0, -offset), max(0, offset)
    length = max(0, min(x.shape[d1] - row, x.shape[d2] - col))
    rest = [k for k in range(x.ndim) if k not in (d1, d2)]
    shape = (*(x.shape[k] for k in rest), length)
    new = _vars(len(shape))
    old: list[Expr] = [ix.const(0)] * x.ndim
    for position, k in enumerate(rest):
        old[k] = new[position]
    old[d1] = ix.add(new[-1], ix.const(row))
    old[d2] = ix.add(new[-1], ix.const(col))
    return x.reindex(shape, tuple(old))


@register("aten.unfold.default", "aten.unfold_copy.default")
def _unfold(ctx: Lower, call: Call) -> TensorValue:
    """Tensor.unfold(dim, size, step): windows of `size` along dim, `step` apart, as a new last dim."""
    x = call.tensor("self")
    dim = _dim(call["dimension"], x.ndim)
    size, step = call["size"], call["step"]
    extent = x.shape[dim] if x.ndim else 1
    count = (extent - size) // step + 1
    shape = (*x.shape[:dim], count, *x.shape[dim + 1:], size) if x.ndim else (size,)
    new = _vars(len(shape))
    if not x.ndim:
        return x.reindex(shape, ())
    old = list(new[:x.ndim])
    old[dim] = ix.add(ix.scale(new[dim], step), new[-1])
    return x.reindex(shape, tuple(old))


@register("aten.split_with_sizes.default", "aten.split.Tensor", "aten.split_with_sizes_copy.default",
          "aten.unbind.int", "aten.unbind_copy.int", "aten.chunk.default", "aten.split_copy.Tensor")
def _split(ctx: Lower, call: Call) -> tuple[TensorValue, ...]:
    x = call.tensor("self")
    dim = _dim(call["dim"], x.ndim)
    size = x.shape[dim]
    name = call.target.split(".")[1]
    if name in ("unbind", "unbind_copy"):
        return tuple(_select_value(x, dim, i) for i in range(size))
    if name in ("split_with_sizes", "split_with_sizes_copy"):
        sizes = list(call["split_sizes"])
    else:
        step = call["split_size"] if name in ("split", "split_copy") else -(-size // call["chunks"])
        sizes = [min(step, size - s) for s in range(0, size, step)] or [0]
    out, start = [], 0
    for s in sizes:
        out.append(slice_dim(x, dim, start, start + s, 1))
        start += s
    return tuple(out)


def _select_value(x: TensorValue, dim: int, i: int) -> TensorValue:
    shape = x.shape[:dim] + x.shape[dim + 1:]
    new = _vars(len(shape))
    return x.reindex(shape, (*new[:dim], ix.const(i), *new[dim:]))


@register("aten.flip.default")
def _flip(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    dims = {_dim(d, x.ndim) for d in call["dims"]}
    old = [ix.add(ix.const(x.shape[k] - 1), ix.scale(view_var(k), -1)) if k in dims else view_var(k)
           for k in range(x.ndim)]
    return x.reindex(x.shape, tuple(old))


@register("aten.repeat.default")
def _repeat(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    repeats = list(call["repeats"])
    lead = len(repeats) - x.ndim
    shape = tuple(r * (x.shape[k - lead] if k >= lead else 1) for k, r in enumerate(repeats))
    ranges = {f"v{k}": s for k, s in enumerate(shape)}
    old = tuple(ix.mod(view_var(lead + k), size, ranges) for k, size in enumerate(x.shape))
    return x.reindex(shape, old)


@register("aten.as_strided.default", "aten.as_strided_copy.default")
def _as_strided(ctx: Lower, call: Call) -> TensorValue:
    x = call.tensor("self")
    base = x.buffer
    if base.name in ctx.eager_strides:
        raise LoweringError(f"as_strided over {base.name}, which eager lays out with strides "
                            f"{list(ctx.eager_strides[base.name])} and kiln with {list(base.stride)}",
                            "call .contiguous() before as_strided, or use a view op (view, permute, ...)")
    start = x.strided()
    if base.stride != _contiguous(base.shape) or start is None:
        # Note: as_strided addresses the storage; a storage that is not row-major (a strided
        # input), or a view without strides, is handed to aten as it is.
        fallback: TensorValue = lower_fallback(ctx, call)
        return fallback
    origin = call["storage_offset"]
    if origin is None:
        origin = start.offset
    shape, stride = tuple(call["size"]), tuple(call["stride"])
    ranges = {f"v{k}": s for k, s in enumerate(shape)}
    flat = ix.add(ix.const(origin), *(ix.scale(view_var(k), s) for k, s in enumerate(stride)))
    whole = TensorValue.of(base)
    return whole.reindex(shape, ix.unflatten_index(flat, base.shape, ranges))


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    from tasks.ir.nodes import contiguous_strides

    return contiguous_strides(shape)


@register("aten._assert_tensor_metadata.default", "aten._assert_async.msg",
          "aten._assert_scalar.default", "aten.sym_constrain_range_for_size.default",
          "aten._assert_async.default")
def _no_op(ctx: Lower, call: Call) -> Any:
    return None
