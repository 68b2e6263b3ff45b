"""Extern kernels: matmuls, convolution and attention run as library calls on strided views.

Their inputs are views of buffers (a transposed weight is a stride swap, not a copy); only a
view that strides cannot describe is copied first. The scheduler never fuses across them.
"""

from __future__ import annotations

import math

from tasks.ir.dtypes import DType
from tasks.ir.expr import Op, binary, cast, const, where
from tasks.ir.nodes import ExternOp
from tasks.lower.context import Call, Lower, LoweringError
from tasks.lower.registry import register
from tasks.lower.values import TensorValue


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
    if params == {"beta": 1, "alpha": 1} and call.meta.dtype in (DType.F32, DType.F64):
        return _matmul_then_bias(ctx, call, op, inputs)
    return ctx.extern(op, list(inputs), params, call)


def _matmul_then_bias(ctx: Lower, call: Call, op: ExternOp, inputs: list[TensorValue]) -> TensorValue:
    """addmm as mm and a pointwise bias add, which the scheduler fuses into the kernel that
    reads the product (a GELU, a residual and layer norm) instead of addmm's own pass that
    copies the expanded bias into the output first.

    Note: fp32 and fp64 only: for fp16/bf16 the product would round before the add.
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
    return ctx.extern(ExternOp.CONVOLUTION, inputs, params, call)


@register("aten.scaled_dot_product_attention.default")
def _sdpa(ctx: Lower, call: Call) -> TensorValue:
    if call["dropout_p"]:
        raise LoweringError("attention with dropout_p > 0; kiln compiles inference: call model.eval()")
    mask, query = call["attn_mask"], call.tensor("query")
    if isinstance(mask, TensorValue) and mask.dtype is DType.BOOL:
        mask = additive_mask(ctx, mask, query.dtype, call.origin)
    inputs: list[TensorValue | None] = [query, call.tensor("key"), call.tensor("value"),
                                        mask if isinstance(mask, TensorValue) else None]
    params = {k: call[k] for k in ("dropout_p", "is_causal", "scale", "enable_gqa")}
    return ctx.extern(ExternOp.SDPA, inputs, params, call)


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
