"""Extern kernels: matmuls, convolution and attention run as library calls on strided views.

Their inputs are views of buffers (a transposed weight is a stride swap, not a copy); only a
view that strides cannot describe is copied first. The scheduler never fuses across them.
"""

from __future__ import annotations

import math
from typing import Any

from tasks.ir.dtypes import DType
from tasks.ir.expr import Op, binary, cast, const, where
from tasks.ir.nodes import ExternOp, channels_last_strides, is_dense
from tasks.lower.consumers import only_externs_read
from tasks.lower.context import Call, Lower, LoweringError, OutMeta
from tasks.lower.layout import takes_channels_last
from tasks.lower.registry import lower_fallback, register
from tasks.lower.values import TensorValue
from tasks.lower.views import permute, reshape


@register("aten.mm.default")
def _mm(ctx: Lower, call: Call) -> TensorValue:
    return ctx.extern(ExternOp.MM, [call.tensor("self"), call.tensor("mat2")], {}, call)


@register("aten.bmm.default")
def _bmm(ctx: Lower, call: Call) -> TensorValue:
    return ctx.extern(ExternOp.BMM, [call.tensor("self"), call.tensor("mat2")], {}, call)


@register("aten.addmm.default", "aten.baddbmm.default")
def _addmm(ctx: Lower, call: Call) -> TensorValue:
    op = ExternOp.ADDMM if call.target == "aten.addmm.default" else ExternOp.BADDBMM
    first = "mat1" if op is ExternOp.ADDMM else "batch1"
    second = "mat2" if op is ExternOp.ADDMM else "batch2"
    inputs = [call.tensor("self"), call.tensor(first), call.tensor(second)]
    params = {"beta": call["beta"], "alpha": call["alpha"]}
    fusible = not only_externs_read(ctx, call.origin)
    if params == {"beta": 1, "alpha": 1} and call.meta.dtype in (DType.F32, DType.F64) and fusible:
        return _matmul_then_bias(ctx, call, op, inputs)
    return ctx.extern(op, list(inputs), params, call)


def _matmul_then_bias(ctx: Lower, call: Call, op: ExternOp, inputs: list[TensorValue]) -> TensorValue:
    """addmm as mm and a pointwise bias add, which the scheduler fuses into the kernel that
    reads the product (a GELU, a residual and layer norm) instead of addmm's own pass that
    copies the expanded bias into the output first.

    Note: fp32 and fp64 only: for fp16/bf16 the product would round before the add. And only
    where a kernel of kiln's reads the result: where only externs (attention, a matmul) or the
    graph's output do, the bias add would be a kernel of its own, a pass over the product that
    cuBLAS's addmm does in its epilogue (bert's query, key and value projections: 36 of its 88
    kernel launches, 36% of its kernel time on an H100, were these).
    """
    bias, first, second = inputs
    product = ctx.extern(ExternOp.MM if op is ExternOp.ADDMM else ExternOp.BMM, [first, second], {}, call)
    dtype = call.meta.dtype
    return ctx.pointwise(product.shape, dtype, call.origin, lambda loop: binary(
        Op.ADD, loop.load(product, loop.idx), cast(loop.broadcast_load(bias), dtype)))


@register("aten.convolution.default")
def _convolution(ctx: Lower, call: Call) -> TensorValue:
    bias = call["bias"]
    params = {k: call[k] for k in ("stride", "padding", "dilation", "transposed", "output_padding", "groups")}
    params = {k: list(v) if isinstance(v, list | tuple) else v for k, v in params.items()}
    inputs: list[TensorValue | None] = [call.tensor("input"), call.tensor("weight"),
                                        bias if isinstance(bias, TensorValue) else None]
    meta, transposed = call.meta, bool(params["transposed"])
    if not takes_channels_last(ctx.layout, meta.dtype, len(meta.shape), transposed):
        return ctx.extern(ExternOp.CONVOLUTION, inputs, params, call)
    split = isinstance(bias, TensorValue) and _bias_after_cudnn(inputs, int(params["groups"]), meta.dtype)
    out = ctx.extern(ExternOp.CONVOLUTION, [*inputs[:2], None] if split else inputs, params, call,
                     channels_last_strides(meta.shape))
    ctx.channels_last.add(out.buffer.name)
    if not isinstance(bias, TensorValue) or not split:
        return out
    channel_bias = reshape(bias, (bias.shape[0], 1, 1))  # broadcast over the plane
    return ctx.pointwise(meta.shape, meta.dtype, call.origin, lambda loop: binary(
        Op.ADD, loop.load(out, loop.idx), loop.broadcast_load(channel_bias)))


# Note: eager's cuDNN convolution adds its bias after the call, in place, in a pass of its own
# (aten/src/ATen/native/Convolution.cpp: output.add_(reshape_bias(...))); at::convolution,
# which kiln calls where a bias is given, does the same into a result of its own that the
# runtime then copies into kiln's buffer. So, laid out channels-last (on cuDNN in half
# precision), kiln calls the convolution without its bias, into its own buffer
# (wrapper.on_cudnn), and adds the bias in a pointwise kernel, which the schedule fuses into
# the kernel after it (a norm, an activation): two passes fewer, with eager's roundings (the
# product rounds to the dtype, then the add rounds once). A depthwise convolution keeps its bias,
# as on_cudnn leaves it to at::convolution (whose own choice of kernel adds it); so does one with
# a sample of more than 2^31 elements, which eager may run off cuDNN, the bias inside the sum.
def _bias_after_cudnn(inputs: list[TensorValue | None], groups: int, dtype: DType) -> bool:
    """Whether a convolution's bias is added after its cuDNN call, as eager adds it."""
    x, weight, bias = inputs
    if x is None or weight is None or bias is None or bias.dtype is not dtype or bias.ndim != 1:
        return False
    if x.dtype is not dtype or weight.dtype is not dtype or 0 in x.shape + weight.shape:
        return False
    if math.prod(x.shape[1:]) > 2**31 - 1:
        return False
    channels = x.shape[1]
    return not (groups > 1 and channels == groups and weight.shape[0] % channels == 0)  # depthwise


@register("aten.scaled_dot_product_attention.default")
def _sdpa(ctx: Lower, call: Call) -> TensorValue:
    if call["dropout_p"]:
        raise LoweringError("attention with dropout_p > 0; kiln compiles inference: call model.eval()")
    mask, query = call["attn_mask"], call.tensor("query")
    key, value = call.tensor("key"), call.tensor("value")
    if query.ndim > 4 or not kernel_takes(query, key, value):
        fallback: TensorValue = lower_fallback(ctx, call)  # torch's own choice: eager's math path
        return fallback
    if isinstance(mask, TensorValue) and mask.dtype is DType.BOOL:
        mask = additive_mask(ctx, mask, query.dtype, call.origin)
    query, key, value = (_unit_last_stride(ctx, v, call.origin) for v in (query, key, value))
    inputs: list[TensorValue | None] = [query, key, value, mask if isinstance(mask, TensorValue) else None]
    # with as many heads in key and value as in the query (kernel_takes), grouping them is a no-op
    params = {k: call[k] for k in ("dropout_p", "is_causal", "scale")} | {"enable_gqa": False}
    # Note: torch's attention kernels (flash on the CPU, memory-efficient on the GPU) take 4-d
    # tensors only, a mask too; eager widens a mask and runs a 2-d or 3-d attention on its math
    # path. kiln hands the kernels 4-d views: size-1 dims put before the tokens, and a mask
    # first aligned on the right with the query, as broadcasting aligns it.
    missing, rank = 4 - query.ndim, query.ndim
    widened = [None if v is None else _widen(v, rank, missing) for v in inputs]
    if missing == 0:
        layout = dense_layout(call.meta.shape, call.meta.stride)
        return ctx.extern(ExternOp.SDPA, widened, params, call, layout)
    out = (*call.meta.shape[:-2], *(1,) * missing, *call.meta.shape[-2:])
    result = ctx.extern(ExternOp.SDPA, widened, params, _product_call(call, out))
    return reshape(result, call.meta.shape)


# Note: kiln calls one attention kernel of torch's directly (flash on the CPU, memory-efficient
# on the GPU), where eager's scaled_dot_product_attention first checks the call against each
# kernel's needs and falls back to its math path. Called on what it does not check, the CPU's
# flash kernel reads out of bounds (a key with a batch of 1 against a query's 2: NaNs) or reads
# a transposed value as if it were not (a wrong result, no error). kiln calls the kernel only
# where every one of its needs holds, and otherwise calls scaled_dot_product_attention itself,
# which chooses as eager does.
def kernel_takes(query: TensorValue, key: TensorValue, value: TensorValue) -> bool:
    """Whether torch's attention kernels (both targets') take these tensors as they are (the last
    dim's stride aside: _unit_last_stride sees to it; more than 4 dims aside: _sdpa checks)."""
    lead = query.shape[:-2]
    if key.shape[:-2] != lead or value.shape[:-2] != lead:
        return False  # broadcast batch or heads, or grouped-query heads
    if key.shape[-2] != value.shape[-2] or key.shape[-1] != query.shape[-1]:
        return False  # let torch say what is wrong, as eager does
    if 0 in query.shape or 0 in key.shape or 0 in value.shape:
        return False
    # the CPU's flash kernel: one head size; the GPU's memory-efficient one: head sizes in whole
    # 16-byte vectors (the program, traced on the CPU, is lowered alike for both targets)
    per_vector = 16 // query.dtype.itemsize
    return value.shape[-1] == query.shape[-1] and query.shape[-1] % per_vector == 0


def _unit_last_stride(ctx: Lower, x: TensorValue, origin: str) -> TensorValue:
    """x, copied where its view does not step by one element along its last dim (the kernels
    read a head's vector as contiguous)."""
    strided = x.strided()
    if strided is None or x.shape[-1] == 1 or strided.stride[-1] == 1:
        return x  # ctx.view copies what strides cannot say
    return ctx.copy(x, origin)


def _widen(x: TensorValue, rank: int, missing: int) -> TensorValue:
    """x as a 4-d view: left-padded with size-1 dims to `rank` (the query's), then `missing`
    size-1 dims before its last two."""
    shape = (1,) * (rank - x.ndim) + x.shape
    shape = (*shape[:rank - 2], *(1,) * missing, *shape[rank - 2:])
    return x if shape == x.shape else reshape(x, shape)


# Note: attention's buffer takes the layout eager gave its result in the trace. torch's
# attention kernels return [B, H, L, E] with the heads inside the tokens ([B, L, H, E] in
# memory): the GPU's always, the CPU's flash kernel where the query is laid out so, as a
# transformer's query (a linear layer's output, split into heads) is. Laid out the same way,
# the runtime's copy of the result into kiln's buffer is a straight copy, and the heads' merge
# that follows ([B, H, L, E] -> [B, L, H * E] for the output projection) is a view for the
# matmul, not a transposing kernel of its own (one per layer). And an as_strided over the
# result addresses the storage as eager's does.
def dense_layout(shape: tuple[int, ...], stride: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """`stride` where it lays `shape` out densely (a permutation of row-major: no gaps, no
    overlap); None (row-major) otherwise."""
    return stride if stride is not None and is_dense(shape, stride) else None


# Note: a boolean mask becomes the additive float mask (0 where True, -inf where False) in a
# kernel of its own, as eager's scaled_dot_product_attention converts it: the attention
# kernels kiln calls (torch's CPU flash kernel, the GPU memory-efficient one) take only that.
# One conversion per mask, shared by every attention that reads it: bert's 12 layers read one
# mask, and a conversion each made a kernel with 12 identical outputs, whose tuning key (and so
# its tuning) changed with the layer count.
def additive_mask(ctx: Lower, mask: TensorValue, dtype: DType, origin: str) -> TensorValue:
    """The boolean mask as an additive mask of the query's dtype."""
    compute = dtype.compute
    return ctx.derived(("additive_mask", mask, dtype), lambda: ctx.pointwise(
        mask.shape, dtype, origin,
        lambda loop: where(loop.load(mask, loop.idx), const(0.0, compute), const(-math.inf, compute))))


def _scaled_sum(ctx: Lower, call: Call, product: TensorValue) -> TensorValue:
    """beta * self + alpha * product, in self's broadcast to the output; beta == 0 ignores self
    and alpha == 0 the product (NaNs and infs in them included), as torch's BLAS calls do."""
    beta, alpha, dtype = call["beta"], call["alpha"], call.meta.dtype
    shape = call.meta.shape
    base = reshape(product, shape)

    compute = dtype.compute

    def body(loop: Any) -> Any:
        scaled = binary(Op.MUL, cast(loop.load(base, loop.idx), compute), const(alpha, compute))
        if beta == 0:
            return scaled if alpha != 0 else const(0, compute)
        bias = binary(Op.MUL, cast(loop.broadcast_load(call.tensor("self")), compute), const(beta, compute))
        return bias if alpha == 0 else binary(Op.ADD, bias, scaled)

    return ctx.pointwise(shape, dtype, call.origin, body)


@register("aten.addmv.default")
def _addmv(ctx: Lower, call: Call) -> TensorValue:
    mat, vec = call.tensor("mat"), call.tensor("vec")
    if not call.meta.dtype.is_float:  # integer matmuls are torch's
        fallback: TensorValue = lower_fallback(ctx, call)
        return fallback
    column = reshape(vec, (vec.shape[0], 1))
    product = ctx.extern(ExternOp.MM, [mat, column], {}, _product_call(call, (mat.shape[0], 1)))
    return _scaled_sum(ctx, call, product)


@register("aten.addbmm.default")
def _addbmm(ctx: Lower, call: Call) -> TensorValue:
    """sum over the batch of batch1 @ batch2 is one matmul: (n, b*m) @ (b*m, p)."""
    first, second = call.tensor("batch1"), call.tensor("batch2")
    if not call.meta.dtype.is_float:  # integer matmuls are torch's
        fallback: TensorValue = lower_fallback(ctx, call)
        return fallback
    b, n, m = first.shape
    p = second.shape[2]
    rows = reshape(permute(first, [1, 0, 2]), (n, b * m))
    product = ctx.extern(ExternOp.MM, [rows, reshape(second, (b * m, p))], {}, _product_call(call, (n, p)))
    return _scaled_sum(ctx, call, product)


def _product_call(call: Call, shape: tuple[int, ...]) -> Call:
    """The call as the matmul inside it sees it: its output's shape, in the output's dtype."""
    return Call(call.target, call.origin, call.args, OutMeta(shape, call.meta.dtype))
