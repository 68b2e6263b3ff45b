"""Matmul epilogues: a matmul call and the kernel right after it that reads its product, which a
target may run as one kernel (the cuda target's matmul template, tasks/codegen/triton_matmul.py)
or as the two steps they are.

Note: the schedule only marks the pairs, and keeps the call's inputs alive through the kernel
(the arena may not hand their memory to the kernel's outputs), so that a target that fuses
them reads the call's inputs where the call would have: the steps, their order and every
other buffer stay as they are, and the targets that do not fuse run the schedule unchanged.
"""

from __future__ import annotations

import math

from tasks.ir import index as ix
from tasks.ir.dtypes import DType
from tasks.ir.expr import Expr, Op, loads, var
from tasks.ir.nodes import Extern, ExternOp, Pointwise
from tasks.schedule.model import CallStep, Kernel, KernelStep, Param, Schedule, ScheduledGraph

MATMULS = (ExternOp.MM, ExternOp.BMM, ExternOp.ADDMM, ExternOp.BADDBMM)
FLOATS = (DType.F16, DType.BF16, DType.F32)


def marked_pairs(schedule: Schedule, g: ScheduledGraph) -> list[tuple[int, Extern, Kernel]]:
    """The pairs the schedule marked in g (ScheduledGraph.epilogues): (the call's step, the
    call, its epilogue kernel)."""
    pairs = []
    for i in g.epilogues:
        call, after = g.steps[i], g.steps[i + 1]
        if isinstance(call, CallStep) and isinstance(call.node, Extern) and isinstance(after, KernelStep):
            pairs.append((i, call.node, schedule.kernel(after.kernel)))
    return pairs


def product_param(call: Extern, kernel: Kernel) -> Param | None:
    """The kernel's parameter that reads the call's product where the kernel is the call's
    epilogue: a float matmul whose product the kernel reads, only at the product's own index,
    in a pointwise kernel over the product's shape; None otherwise."""
    if call.op not in MATMULS or call.out.dtype not in FLOATS or 0 in call.out.shape:
        return None
    if any(v is None or v.dtype is not call.out.dtype for v in call.inputs[-2:]):
        return None
    if kernel.reduce_ranges or not _covers(kernel.ranges, call.out.shape):
        return None
    if not all(isinstance(n, Pointwise) for n in kernel.nodes):
        return None
    product = [p for p in kernel.params if p.buffer == call.out.name]
    if len(product) != 1 or product[0].role != "in":
        return None
    for node in kernel.nodes:
        assert isinstance(node, Pointwise)
        for load in loads(node.body):
            if load.arg == product[0].name and not _at_own_place(load.args, kernel.ranges):
                return None
    return product[0]


def _covers(ranges: tuple[int, ...], product: tuple[int, ...]) -> bool:
    """The kernel's loops walk the product: its shape, or a 2-d product's rows spread over the
    kernel's leading loops (a linear layer on (batch, tokens, features): the matmul's rows are
    batch x tokens)."""
    if ranges == product:
        return True
    return len(product) == 2 and len(ranges) > 2 and ranges[-1] == product[1] \
        and math.prod(ranges[:-1]) == product[0]


def _at_own_place(args: tuple[Expr, ...], ranges: tuple[int, ...]) -> bool:
    """A read of the product at the element the kernel computes: (i0, .., in) where the shapes
    agree, else (the row-major flattening of the leading loops, the last loop)."""
    names = [var(f"i{n}") for n in range(len(ranges))]
    if len(args) == len(ranges):
        return all(a.op is Op.VAR and a.arg == f"i{n}" for n, a in enumerate(args))
    if len(args) != 2 or not (args[1].op is Op.VAR and args[1].arg == f"i{len(ranges) - 1}"):
        return False
    ones = {names[n] for n, size in enumerate(ranges) if size == 1}  # a size-1 loop's term may be dropped

    def terms(e: Expr) -> tuple[dict[Expr, int], int]:
        found, constant = ix.linear(e)
        return {a: c for a, c in found.items() if a not in ones}, constant

    return terms(args[0]) == terms(ix.flatten_index(tuple(names[:-1]), ranges[:-1]))
