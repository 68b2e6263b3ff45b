"""Extern kernels: matmuls, convolution and attention run as library calls on strided views.

Their inputs are views of buffers (a transposed weight is a stride swap, not a copy); only a
view that strides cannot describe is copied first. The scheduler never fuses across them.
"""

from __future__ import annotations

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
    return ctx.extern(op, list(inputs), params, call)


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
    mask = call["attn_mask"]
    inputs: list[TensorValue | None] = [call.tensor("query"), call.tensor("key"), call.tensor("value"),
                                        mask if isinstance(mask, TensorValue) else None]
    params = {k: call[k] for k in ("dropout_p", "is_causal", "scale", "enable_gqa")}
    return ctx.extern(ExternOp.SDPA, inputs, params, call)
