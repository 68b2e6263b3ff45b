"""A matmul and its epilogue as one Triton kernel: the product is computed a tile at a time with
`tl.dot` over K, rounded to the product's dtype as the library call's result would be, and the
pointwise kernel that reads it (a bias, a GELU, a residual add, a scaling) runs on that tile in
registers, so the product never goes to memory.

The matmul is one of the schedule's extern calls (mm, bmm, addmm, baddbmm) and the epilogue one
of its kernels: a pointwise kernel over the product's shape that reads the product only at its
own index. The kernel's parameters are the call's inputs (a, b, and addmm's `self`), then the
epilogue's other parameters in their order; each is a pointer to the first element of a view
whose strides are compiled in. The grid is batch x row tiles x column tiles, on its first axis;
row tiles are grouped (GROUP_M) so that the programs running at once share columns of b in L2.

Note: rounding as the library does. cuBLAS accumulates in float32 and rounds its result once to
the output dtype, after adding addmm's `beta * self`; the epilogue then reads that rounded value,
as kiln's epilogue kernel reads the product buffer. float32 inputs are multiplied in full
precision (`input_precision="ieee"`), as torch's matmuls are unless TF32 is allowed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from cache.hashing import digest_json
from contract.timings import MATMUL_PAIR
from tasks.codegen.triton_expr import TL, Shape
from tasks.codegen.triton_kernel import (
    SIGNATURE_TYPES,
    TritonVariant,
    _KernelGen,
    _unflatten,
    kernel_name,
    module_text,
)
from tasks.ir.dtypes import DType
from tasks.ir.expr import Expr
from tasks.ir.nodes import Extern, ExternOp, View
from tasks.schedule.epilogues import marked_pairs, product_param
from tasks.schedule.model import MAIN, Kernel, Param, Schedule, ScheduledGraph, subgraphs


@dataclass(frozen=True)
class Matmul:
    """A matmul call and the epilogue kernel that reads its product (`product`: its param)."""

    call: Extern
    epilogue: Kernel
    product: Param

    @property
    def a(self) -> View:
        return _view(self.call.inputs[-2])

    @property
    def b(self) -> View:
        return _view(self.call.inputs[-1])

    @property
    def bias(self) -> View | None:
        return self.call.inputs[0] if self.call.op in (ExternOp.ADDMM, ExternOp.BADDBMM) else None

    @property
    def scales(self) -> tuple[float, float]:
        """(alpha, beta) of addmm and baddbmm; (1, 0) for mm and bmm."""
        params = json.loads(self.call.params)
        return float(params.get("alpha", 1)), float(params.get("beta", 0))

    @property
    def batched(self) -> bool:
        return self.call.op in (ExternOp.BMM, ExternOp.BADDBMM)

    @property
    def sizes(self) -> tuple[int, int, int, int]:
        """(batch, M, N, K): batch 1 for mm and addmm."""
        a, b = self.a, self.b
        batch = a.shape[0] if self.batched else 1
        return batch, a.shape[-2], b.shape[-1], a.shape[-1]

    def views(self) -> dict[str, View]:
        """The call's inputs by the template's parameter names: a, b, and addmm's `bias`."""
        return {"a": self.a, "b": self.b} | ({"bias": self.bias} if self.bias is not None else {})

    def param_names(self) -> list[str]:
        """The kernel's parameters: the call's inputs, then the epilogue's but the product."""
        return [*self.views(), *(p.name for p in self.epilogue.params if p is not self.product)]

    @property
    def key(self) -> str:
        """The pair's structure: the call's op, scalars and operand layouts (never buffer
        names), the epilogue kernel's key and which of its parameters is the product. Equal
        pairs are generated and tuned once, as equal kernels are."""
        # Note: an operand's offset reaches the kernel only as whether its pointer is aligned
        # (the wrapper passes a pointer to the view's first element): q, k and v of one buffer
        # are one pair.
        views = [[list(v.shape), list(v.stride), v.offset * v.dtype.itemsize % 16 == 0, v.dtype.value]
                 for v in self.views().values()]
        index = self.epilogue.params.index(self.product)
        return digest_json(["matmul", self.call.op.value, self.call.params, views, self.epilogue.key, index])

    def unaligned(self) -> list[str]:
        """The call's inputs whose first element may not sit on 16 bytes: a view at an offset
        into its buffer (the wrapper aligns buffers, not views)."""
        return [name for name, v in self.views().items() if v.offset * v.dtype.itemsize % 16]


def _view(v: View | None) -> View:
    if v is None:
        raise ValueError("a matmul's operand is absent")
    return v


def matmul_epilogue(call: Extern, epilogue: Kernel) -> Matmul | None:
    """The pair as one template, or None where the kernel is not the call's epilogue
    (tasks/schedule/epilogues.py: product_param)."""
    product = product_param(call, epilogue)
    return None if product is None else Matmul(call, epilogue, product)


def matmul_pairs(schedule: Schedule) -> dict[str, list[tuple[Matmul, str]]]:
    """Every matmul call the schedule marked with its epilogue kernel (ScheduledGraph.epilogues),
    in every graph, as a template with the place it sits in (MAIN, a branch, a loop body),
    grouped by the pair's key."""
    found: dict[str, list[tuple[Matmul, str]]] = {}

    def walk(g: ScheduledGraph, place: str) -> None:
        for _, call, kernel in marked_pairs(schedule, g):
            m = matmul_epilogue(call, kernel)
            if m is not None:
                found.setdefault(m.key, []).append((m, place))
        for step in g.steps:
            for name, sub in subgraphs(step):
                walk(sub, name if place == MAIN else f"{place}/{name}")

    walk(schedule.main, MAIN)
    return found


def matmul_name(m: Matmul) -> str:
    """The pair's kernel name: its epilogue kernel's, after MATMUL_PAIR (contract/timings.py)."""
    return f"{MATMUL_PAIR}{kernel_name(m.epilogue)}"


def matmul_configs(m: Matmul) -> list[dict[str, int]]:
    """Tile shapes for Hopper (the default first), fewer where the product is small: XBLOCK rows
    (M), RBLOCK columns (N), KBLOCK of the inner dimension, GROUP_M row tiles per group."""
    _, rows, cols, depth = m.sizes
    found: list[dict[str, int]] = []
    for bm, bn, bk, warps, stages in ((128, 128, 64, 8, 3), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4),
                                      (64, 64, 64, 4, 4), (128, 256, 64, 8, 3), (64, 64, 32, 4, 5),
                                      (32, 64, 32, 4, 5), (16, 64, 64, 4, 4)):
        shrunk = {"XBLOCK": max(16, min(bm, _pow2(rows))), "RBLOCK": max(16, min(bn, _pow2(cols))),
                  "KBLOCK": max(16, min(bk, _pow2(depth))), "GROUP_M": 8, "num_warps": warps,
                  "num_stages": stages}
        if shrunk not in found:
            found.append(shrunk)
    return found


def matmul_signature(m: Matmul) -> dict[str, str]:
    views = [m.a, m.b] + ([m.bias] if m.bias is not None else [])
    sig = {name: "*" + SIGNATURE_TYPES[v.dtype] for name, v in zip(("a", "b", "bias"), views, strict=False)}
    sig |= {p.name: "*" + SIGNATURE_TYPES[p.spec.dtype] for p in m.epilogue.params if p is not m.product}
    return sig | dict.fromkeys(("XBLOCK", "RBLOCK", "KBLOCK", "GROUP_M"), "constexpr")


def matmul_grid(m: Matmul, config: dict[str, int]) -> tuple[int, int, int]:
    """Every batch's tiles along the grid's first axis (its second holds at most 65535)."""
    batch, rows, cols, _ = m.sizes
    tiles = -(-rows // config["XBLOCK"]) * -(-cols // config["RBLOCK"])
    return tiles * batch, 1, 1


def _span(v: View) -> int:
    """Elements from a view's first to one past its last."""
    return 1 + sum((size - 1) * stride for size, stride in zip(v.shape, v.stride, strict=True))


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def matmul_source(m: Matmul, name: str) -> str:
    gen = _MatmulGen(m)
    body = gen.body()
    params = [*m.param_names(), "XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr", "KBLOCK: tl.constexpr",
              "GROUP_M: tl.constexpr"]
    return module_text(name, params, body, gen.helpers)


class _MatmulGen(_KernelGen):
    """The epilogue kernel's generator, tiled over the product's rows and columns, with the
    product's tile computed first and read from registers (see the module's note)."""

    def __init__(self, m: Matmul) -> None:
        super().__init__(m.epilogue, TritonVariant("matmul", split=len(m.epilogue.ranges) - 1))
        self.m = m

    def load(self, e: Expr, idx: list[tuple[str, Shape]],
             guard: tuple[str, Shape] | None) -> tuple[str, Shape]:
        if str(e.arg) == self.m.product.name:  # read at its own place (tasks/schedule/epilogues.py)
            return "product", frozenset({"x", "r"})
        return super().load(e, idx, guard)

    def body(self) -> list[str]:
        m = self.m
        _, rows, cols, depth = m.sizes
        n = len(m.call.out.shape)
        views = [m.a, m.b] + ([m.bias] if m.bias is not None else [])
        self.wide |= max(_span(v) for v in views) >= 2**31 - 1
        wide = ".to(tl.int64)" if self.wide else ""
        lines = [f"pid = tl.program_id(0){wide}",
                 f"tiles_m = tl.cdiv({rows}, XBLOCK)", f"tiles_n = tl.cdiv({cols}, RBLOCK)"]
        if m.batched:  # the batch's tiles follow one another along the grid
            lines += ["i0 = pid // (tiles_m * tiles_n)", "pid = pid % (tiles_m * tiles_n)"]
        lines += ["group = GROUP_M * tiles_n", "first_m = (pid // group) * GROUP_M",
                  "group_m = tl.minimum(tiles_m - first_m, GROUP_M)",
                  "pid_m = first_m + (pid % group) % group_m", "pid_n = (pid % group) // group_m",
                  "xindex = pid_m * XBLOCK + tl.arange(0, XBLOCK)[:, None]", f"xmask = xindex < {rows}",
                  "rindex = pid_n * RBLOCK + tl.arange(0, RBLOCK)[None, :]", f"rmask = rindex < {cols}",
                  f"i{len(m.epilogue.ranges) - 1} = rindex"]
        if len(m.epilogue.ranges) > n:  # the product's rows spread over the epilogue's leading loops
            lines += _unflatten("xindex", "i", m.epilogue.ranges[:-1])
        else:
            lines.append(f"i{n - 2} = xindex")
        lines += self.product_tile(depth)
        return lines + self.pointwise_body()

    def product_tile(self, depth: int) -> list[str]:
        m = self.m
        a, b = m.a, m.b
        batch_a = f"i0 * {a.stride[0]} + " if m.batched and a.stride[0] else ""
        batch_b = f"i0 * {b.stride[0]} + " if m.batched and b.stride[0] else ""
        precision = ', input_precision="ieee"' if m.call.out.dtype is DType.F32 else ""
        lines = ["acc = tl.zeros([XBLOCK, RBLOCK], dtype=tl.float32)",
                 f"for k in range(0, {depth}, KBLOCK):",
                 "    kk = k + tl.arange(0, KBLOCK)",
                 f"    left = tl.load(a + {batch_a}xindex * {a.stride[-2]} + kk[None, :] * {a.stride[-1]}, "
                 f"xmask & (kk[None, :] < {depth}), other=0.0)",
                 f"    right = tl.load(b + {batch_b}kk[:, None] * {b.stride[-2]} + rindex * {b.stride[-1]}, "
                 f"(kk[:, None] < {depth}) & rmask, other=0.0)",
                 f"    acc += tl.dot(left, right{precision})"]
        alpha, beta = m.scales
        value = "acc" if alpha == 1 else f"acc * {alpha!r}"
        if m.bias is not None and beta != 0:
            lines.append(f"bias_tile = {self.bias_load(m.bias)}.to(tl.float32)")
            value = f"{value} + bias_tile" if beta == 1 else f"{value} + bias_tile * {beta!r}"
        dtype = m.call.out.dtype
        rounded = f"({value}).to({TL[dtype]}).to(tl.float32)" if dtype is not DType.F32 else f"({value})"
        return [*lines, f"product = {rounded}"]

    def bias_load(self, bias: View) -> str:
        """addmm's `self`, broadcast to the product as torch broadcasts it (aligned on the right)."""
        out = self.m.call.out.shape
        place = ["i0", "xindex", "rindex"][-len(out):]  # the product's index: (batch,) row, column
        lead = len(out) - len(bias.shape)
        terms, dims = [], set()
        for d, (size, stride) in enumerate(zip(bias.shape, bias.stride, strict=True)):
            if size != 1 and stride != 0:
                terms.append(f"{place[lead + d]} * {stride}")
                dims.add(lead + d)
        offset = " + ".join(terms) if terms else "0"
        tiled = {len(out) - 2, len(out) - 1} <= dims  # both the row and the column index: a full tile
        full = "" if tiled else f"tl.full([XBLOCK, RBLOCK], 0, {self.index_type()}) + "
        return f"tl.load(bias + {full}{offset}, xmask & rmask, other=0.0)"

