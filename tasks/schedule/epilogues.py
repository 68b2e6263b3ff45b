"""Matmul epilogues: a matmul call and the kernel right after it that reads its product, which a
target may run as one kernel (the cuda target's matmul template, tasks/codegen/triton_matmul.py)
or as the two steps they are.

Note: the schedule only marks the pairs, and keeps the call's inputs alive through the kernel
(the arena may not hand their memory to the kernel's outputs), so that a target that fuses
them reads the call's inputs where the call would have: the steps, their order and every
other buffer stay as they are, and the targets that do not fuse run the schedule unchanged.
"""

from __future__ import annotations

from tasks.ir.dtypes import DType
from tasks.ir.expr import Op, loads
from tasks.ir.nodes import Extern, ExternOp, Pointwise
from tasks.schedule.model import Kernel, Param

MATMULS = (ExternOp.MM, ExternOp.BMM, ExternOp.ADDMM, ExternOp.BADDBMM)
FLOATS = (DType.F16, DType.BF16, DType.F32)


def product_param(call: Extern, kernel: Kernel) -> Param | None:
    """The kernel's parameter that reads the call's product where the kernel is the call's
    epilogue: a float matmul whose product the kernel reads, only at the product's own index,
    in a pointwise kernel over the product's shape; None otherwise."""
    if call.op not in MATMULS or call.out.dtype not in FLOATS or 0 in call.out.shape:
        return None
    if any(v is None or v.dtype is not call.out.dtype for v in call.inputs[-2:]):
        return None
    if kernel.reduce_ranges or kernel.ranges != call.out.shape:
        return None
    if not all(isinstance(n, Pointwise) for n in kernel.nodes):
        return None
    product = [p for p in kernel.params if p.buffer == call.out.name]
    if len(product) != 1 or product[0].role != "in":
        return None
    own = tuple(f"i{n}" for n in range(len(call.out.shape)))
    for node in kernel.nodes:
        assert isinstance(node, Pointwise)
        for load in loads(node.body):
            if load.arg == product[0].name and \
                    tuple(str(a.arg) if a.op is Op.VAR else None for a in load.args) != own:
                return None
    return product[0]
