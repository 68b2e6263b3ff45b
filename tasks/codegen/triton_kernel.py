"""A scheduled kernel as a Triton module: one `@triton.jit` function, the CUDA target's kernel.

    @triton.jit
    def k3_red_softmax(in0, out0, xnumel, rnumel, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
        xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
        ... row stages and passes over R (see tasks/schedule/kernel_loops.py) ...

X is flattened to xnumel rows, XBLOCK per program; R to rnumel. Variants of a reduction:
"persistent" holds all of R in one [XBLOCK, RBLOCK] block and runs the passes back to back;
"looped" runs each pass as a loop over R in RBLOCK chunks, one accumulator per lane, combined
across lanes after the loop. A pointwise kernel that reads or writes one buffer along another
dimension than the rest (a transpose) also gets a "tiled" variant: its loop nest split into an
outer and an inner group, walked in [XBLOCK, RBLOCK] tiles, so both access directions are
contiguous in one of the tile's axes. Every variant of a kernel takes the same arguments.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from typing import Any

from tasks.codegen.triton_expr import HELPERS, NO_SHAPE, TL, ExprWriter, Shape, cast_text, rep
from tasks.ir import index as ix
from tasks.ir.dtypes import DType
from tasks.ir.expr import Expr, Op, loads
from tasks.ir.nodes import Buffer, Pointwise, ReduceOp, Reduction, Scatter
from tasks.schedule.model import Kernel

PERSISTENT_MAX_R = 4096
X: Shape = frozenset({"x"})
R: Shape = frozenset({"r"})
XR: Shape = frozenset({"x", "r"})


SIGNATURE_TYPES = {
    DType.BOOL: "i1", DType.U8: "u8", DType.I8: "i8", DType.I16: "i16", DType.I32: "i32",
    DType.I64: "i64", DType.F16: "fp16", DType.BF16: "bf16", DType.F32: "fp32", DType.F64: "fp64",
}


@dataclass(frozen=True)
class TritonVariant:
    kind: str  # "pointwise", "tiled", "persistent" or "looped"
    split: int = 0  # tiled: how many outer dimensions of the loop nest run along the tile's rows


def triton_variants(k: Kernel) -> list[TritonVariant]:
    if not k.reduce_ranges:
        split = tile_split(k)
        # Note: the tiled variant goes first, so an untuned build (no GPU) uses it: a transpose
        # walked in 1-D blocks reads or writes with a stride on every element.
        return [TritonVariant("tiled", split), TritonVariant("pointwise")] if split else \
            [TritonVariant("pointwise")]
    if rnumel(k) <= PERSISTENT_MAX_R:
        return [TritonVariant("persistent"), TritonVariant("looped")]
    return [TritonVariant("looped")]


def xnumel(k: Kernel) -> int:
    if (scatter := _scatter(k)) is not None:
        return math.prod(scatter.ranges)
    return math.prod(k.ranges)


def rnumel(k: Kernel) -> int:
    return math.prod(k.reduce_ranges)


MIN_TILE_SIDE = 8  # a tile's side along a loop group smaller than this gains nothing


def tile_split(k: Kernel) -> int:
    """How many outer loops a tiled variant puts along its rows, or 0 for no tiled variant.

    The loops each parameter is contiguous along (a coefficient of 1 in its flat offset) are
    collected; when the innermost loop is one of them and an outer loop `a`
    is another, the tile splits after `a`, so rows are contiguous for one access and columns for
    the other.
    """
    if k.reduce_ranges or _scatter(k) is not None or len(k.ranges) < 2:
        return 0
    last = len(k.ranges) - 1
    contiguous = _contiguous_loops(k)
    if last not in contiguous or len(contiguous) < 2:
        return 0
    split = max(a for a in contiguous if a != last) + 1
    outer, inner = math.prod(k.ranges[:split]), math.prod(k.ranges[split:])
    return split if min(outer, inner) >= MIN_TILE_SIDE else 0


def _contiguous_loops(k: Kernel) -> set[int]:
    """The loops i<m> along which some parameter's address moves by one element."""
    # Note: a parameter far smaller than the largest (a row's statistics, a bias) is read from
    # cache whatever its direction; only the big ones decide whether tiles pay.
    largest = max(p.spec.nbytes for p in k.params)
    specs = {p.name: p.spec for p in k.params if 8 * p.spec.nbytes >= largest}
    found: set[int] = set()
    for node in k.nodes:
        assert isinstance(node, Pointwise)
        if node.out.name in specs:  # stored at (i0, i1, ...)
            found |= {d for d, (st, size) in enumerate(zip(node.out.stride, node.out.shape, strict=True))
                      if st == 1 and size > 1}
        for e in loads(node.body):
            spec = specs.get(str(e.arg))
            if spec is not None:
                found |= _unit_stride_loops(e.args, spec)
    return found


def _unit_stride_loops(index: tuple[Expr, ...], spec: Buffer) -> set[int]:
    """Loops whose coefficient in the flat offset sum(index[d] * stride[d]) is 1."""
    coefs: dict[Expr, int] = {}
    for e, stride, size in zip(index, spec.stride, spec.shape, strict=True):
        if size == 1 or stride == 0:
            continue
        terms, _ = ix.linear(e)
        for atom, coef in terms.items():
            coefs[atom] = coefs.get(atom, 0) + coef * stride
    return {int(str(atom.arg)[1:]) for atom, coef in coefs.items()
            if coef == 1 and atom.op is Op.VAR and str(atom.arg).startswith("i")}


def tile_numels(k: Kernel, variant: TritonVariant) -> tuple[int, int]:
    """The (rows, columns) a variant's programs cover: X and R, or a tiled kernel's two groups."""
    if variant.kind == "tiled":
        return math.prod(k.ranges[:variant.split]), math.prod(k.ranges[variant.split:])
    return xnumel(k), 1


def kernel_name(k: Kernel) -> str:
    kind = "scatter" if _scatter(k) is not None else "red" if k.reduce_ranges else "pw"
    words: list[str] = []
    for origin in k.origins:
        word = re.sub(r"[^a-z0-9]+", "_", origin.lower()).strip("_")
        word = re.sub(r"(_default|_tensor|_scalar|_int|_dim)+$", "", re.sub(r"^aten_", "", word))
        word = re.sub(r"_\d+$", "", word)
        if word and word not in words:
            words.append(word)
    base = re.sub(r"[^A-Za-z0-9_]", "_", k.name)
    name = "_".join([base, kind, *words[:3]])[:64].rstrip("_")
    return name if name[0].isalpha() or name[0] == "_" else f"k_{name}"


def signature(k: Kernel) -> dict[str, str]:
    sig = {p.name: "*" + SIGNATURE_TYPES[p.spec.dtype] for p in k.params}
    sig |= {"xnumel": "i32", "rnumel": "i32", "XBLOCK": "constexpr", "RBLOCK": "constexpr"}
    return sig


def configs(k: Kernel, variant: TritonVariant) -> list[dict[str, int]]:
    """Candidate launch configs, the default first."""
    xs = _pow2(xnumel(k))
    if variant.kind == "tiled":
        rows, cols = (_pow2(n) for n in tile_numels(k, variant))
        shapes = [(32, 32, 4), (64, 64, 8), (16, 64, 4), (64, 16, 4), (128, 32, 8)]
        out = [(min(x, rows), min(r, cols), w) for x, r, w in shapes]
    elif variant.kind == "pointwise":
        cands = [(1024, 1, 4), (256, 1, 4), (2048, 1, 8), (64, 1, 2), (512, 1, 2), (4096, 1, 16)]
        out = [(min(x, xs), r, w) for x, r, w in cands]
    elif variant.kind == "persistent":
        rb = _pow2(rnumel(k))
        # (elements per block, warps): one row per program up to many short rows per program.
        per_block = [(2048, 4 if rb <= 1024 else 8), (rb, 4 if rb <= 512 else 8), (8192, 8),
                     (rb, 2 if rb <= 512 else 4), (4096, 4), (1024, 2)]
        out = [(min(xs, max(1, per // rb)), rb, w) for per, w in per_block]
    elif variant.kind == "looped":
        rs = _pow2(rnumel(k))
        # (RBLOCK, elements per block, warps): rows fill the block when R is short.
        shapes = [(1024, 1024, 4), (128, 1024, 4), (2048, 2048, 8), (64, 4096, 8)]
        out = [(min(xs, max(1, per // min(rs, rb))), min(rs, rb), w) for rb, per, w in shapes]
    else:
        raise ValueError(f"unknown Triton variant {variant.kind!r}")
    seen = list(dict.fromkeys(out))
    return [{"XBLOCK": x, "RBLOCK": r, "num_warps": w, "num_stages": 1} for x, r, w in seen]


def grid(k: Kernel, variant: TritonVariant, config: dict[str, int]) -> tuple[int, int, int]:
    rows, cols = tile_numels(k, variant)
    return (max(1, -(-rows // config["XBLOCK"]) * -(-cols // config["RBLOCK"])), 1, 1)


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _scatter(k: Kernel) -> Scatter | None:
    if any(isinstance(n, Scatter) for n in k.nodes):
        if len(k.nodes) != 1:
            raise ValueError(f"{k.name}: a scatter shares its kernel with other nodes; Triton needs it alone")
        node = k.nodes[0]
        assert isinstance(node, Scatter)
        return node
    return None


# -- source ------------------------------------------------------------------------------------

def triton_source(k: Kernel, variant: TritonVariant, name: str) -> str:
    if variant not in triton_variants(k):
        raise ValueError(f"{k.name}: no {variant.kind} variant for this kernel")
    gen = _KernelGen(k, variant)
    params = [*(p.name for p in k.params), "xnumel", "rnumel", "XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr"]
    return module_text(name, params, gen.body(), gen.helpers)


def module_text(name: str, params: list[str], body: list[str], helpers: set[str]) -> str:
    """A module holding one jitted kernel: its imports, the helpers its body calls, the kernel."""
    head = ["import triton", "import triton.language as tl", "from triton.language.extra import libdevice",
            "", ""]
    helper_defs = [HELPERS[h] + "\n\n" for h in sorted(helpers)]
    signature = f"def {name}({', '.join(params)}):"
    lines = [*head, *helper_defs, "@triton.jit", signature, *("    " + x for x in body)]
    return "\n".join(lines) + "\n"


class _KernelGen:
    def __init__(self, k: Kernel, variant: TritonVariant) -> None:
        self.k = k
        self.variant = variant
        # a tiled kernel (and a matmul's epilogue, tasks/codegen/triton_matmul.py) walks its loop
        # nest in 2-D tiles: its outer loops along the rows, its inner ones along the columns
        self.tiles = variant.kind in ("tiled", "matmul")
        self.two_d = bool(k.reduce_ranges) or self.tiles
        self.specs = {p.name: p.spec for p in k.params}
        self.locals = {b.name: b for b in k.locals}
        self.helpers: set[str] = set()
        self.counter = itertools.count()
        self.values: dict[str, tuple[str, Shape, bool]] = {}  # buffer -> (name, shape, full)
        self.stored: set[str] = set()
        spans = [xnumel(k) * max(1, rnumel(k))] + [p.spec.nbytes // p.spec.dtype.itemsize for p in k.params]
        self.wide = max(spans) >= 2**31 - 1
        self.ranges = {f"i{n}": s for n, s in enumerate(k.ranges)}
        self.ranges |= {f"r{n}": s for n, s in enumerate(k.reduce_ranges)}

    def fresh(self) -> str:
        return f"tmp{next(self.counter)}"

    def shape_text(self, shape: Shape) -> str:
        if not self.two_d:
            return "[XBLOCK]"
        return {X: "[XBLOCK, 1]", R: "[1, RBLOCK]", XR: "[XBLOCK, RBLOCK]"}.get(shape, "[XBLOCK, 1]")

    def loop_shape(self, n: int) -> Shape:
        """The block axis loop i<n> runs along: rows, or a tiled kernel's inner loops' columns."""
        return R if self.tiles and n >= self.variant.split else X

    def writer(self) -> ExprWriter:
        shapes = {f"i{n}": self.loop_shape(n) for n in range(len(self.k.ranges))}
        shapes |= {f"r{n}": R for n in range(len(self.k.reduce_ranges))}
        if (s := _scatter(self.k)) is not None:
            shapes = {f"i{n}": X for n in range(len(s.ranges))}
        return ExprWriter(self.load, self.ranges, shapes, self.fresh, self.helpers)

    # -- index blocks

    def body(self) -> list[str]:
        k = self.k
        scatter = _scatter(k)
        x_sizes = scatter.ranges if scatter is not None else k.ranges
        pid = "tl.program_id(0).to(tl.int64)" if self.wide else "tl.program_id(0)"
        if self.variant.kind == "tiled":
            return self.tile_block(pid) + self.pointwise_body()
        arange = "tl.arange(0, XBLOCK)[:, None]" if self.two_d else "tl.arange(0, XBLOCK)"
        lines = [f"xindex = {pid} * XBLOCK + {arange}", "xmask = xindex < xnumel"]
        lines += _unflatten("xindex", "i", x_sizes)
        if scatter is not None:
            return lines + self.scatter_body(scatter)
        if not self.two_d:
            return lines + self.pointwise_body()
        if self.variant.kind == "persistent":
            lines += self.r_block("tl.arange(0, RBLOCK)[None, :]")
        for stage in k.stages:
            lines += self.loop_stage(stage.nodes) if stage.loop else self.row_stage(stage.nodes)
        return lines

    def tile_block(self, pid: str) -> list[str]:
        """A tiled kernel's rows (outer loops) and columns (inner loops); sizes are constants,
        the xnumel and rnumel arguments go unused."""
        rows, cols = tile_numels(self.k, self.variant)
        split = self.variant.split
        return [f"pid = {pid}", f"rtiles = ({cols} + RBLOCK - 1) // RBLOCK",
                "xindex = (pid // rtiles) * XBLOCK + tl.arange(0, XBLOCK)[:, None]",
                f"xmask = xindex < {rows}",
                "rindex = (pid % rtiles) * RBLOCK + tl.arange(0, RBLOCK)[None, :]",
                f"rmask = rindex < {cols}",
                *_unflatten("xindex", "i", self.k.ranges[:split]),
                *_unflatten("rindex", "i", self.k.ranges[split:], first=split)]

    def r_block(self, index: str) -> list[str]:
        if self.wide:
            index = f"({index}).to(tl.int64)"
        return [f"rindex = {index}", "rmask = rindex < rnumel",
                *_unflatten("rindex", "r", self.k.reduce_ranges)]

    # -- loads and stores

    def load(self, e: Expr, idx: list[tuple[str, Shape]],
             guard: tuple[str, Shape] | None) -> tuple[str, Shape]:
        name = str(e.arg)
        if name in self.values:
            return self.register(name, e)
        if name in self.locals:
            raise ValueError(f"{self.k.name}: local {name} read before it is computed")
        spec = self.specs[name]
        offset, shape = flat(idx, spec)
        # Note: a 0-d tensor's value is loaded as a column, not a scalar: Triton's interpreter
        # cannot mix a scalar's comparisons with blocks (numpy refuses `&` on them), and the
        # compiled kernel reads the one address once per row either way.
        mask_shape = shape | (guard[1] if guard else NO_SHAPE) or X
        parts = self.masks(mask_shape) + ([f"({guard[0]})"] if guard else [])
        if mask_shape != shape:
            offset = f"tl.full({self.shape_text(mask_shape)}, 0, {self.index_type()}) + {offset}"
        ptr = name if offset == "0" else f"{name} + {offset}"
        text = f"tl.load({ptr})" if not parts else f"tl.load({ptr}, {' & '.join(parts)}, other=0)"
        if spec.dtype.is_half:
            text += ".to(tl.float32)"
        return text, mask_shape

    def register(self, name: str, e: Expr) -> tuple[str, Shape]:
        """A buffer this kernel computed earlier, read back at its own position: its register."""
        value, shape, full = self.values[name]
        n_x = len(self.k.ranges)
        want = [f"i{n}" for n in range(n_x)]
        if full:
            want += [f"r{n}" for n in range(len(self.k.reduce_ranges))]
        buf = self.locals.get(name) or self.specs[name]
        for a, v, size in zip(e.args, want, buf.shape, strict=True):
            if not ((a.op is Op.VAR and a.arg == v) or (size == 1 and a.op is Op.CONST and a.arg == 0)):
                raise ValueError(f"{self.k.name}: {name} is read at another position than it is "
                                 "computed in the same kernel; Triton cannot share registers across lanes")
        return value, shape

    def index_type(self) -> str:
        return "tl.int64" if self.wide else "tl.int32"

    def masks(self, shape: Shape) -> list[str]:
        return [m for s, m in (("x", "xmask"), ("r", "rmask")) if s in shape]

    def store(self, out: Buffer, value: tuple[str, Shape], dtype: DType, full: bool) -> list[str]:
        """Store a root value (if out is a parameter) and keep it for reads later in the kernel."""
        shape = XR if full or self.tiles else X
        self.values[out.name] = (value[0], value[1], full)
        if out.name in self.locals or out.name in self.stored:
            return []
        self.stored.add(out.name)
        idx = [(f"i{n}", self.loop_shape(n)) for n in range(len(self.k.ranges))]
        if full:
            idx += [(f"r{n}", R) for n in range(len(self.k.reduce_ranges))]
        offset, off_shape = flat(idx, self.specs[out.name])
        if off_shape != shape:
            offset = f"tl.full({self.shape_text(shape)}, 0, {self.index_type()}) + {offset}"
        v = value[0] if dtype is out.dtype and dtype in (DType.F32, DType.F64, DType.BOOL) \
            else f"{value[0]}.to({TL[out.dtype]})"
        return [f"tl.store({out.name} + {offset}, {v}, {' & '.join(self.masks(shape))})"]

    # -- kernels

    def pointwise_body(self) -> list[str]:
        lines: list[str] = []
        for node in self.k.nodes:
            assert isinstance(node, Pointwise)
            w = self.writer()
            lines += w.emit([node.body])
            lines += self.store(node.out, w.ref(node.body), node.body.dtype, full=False)
        return lines

    def row_stage(self, nodes: tuple[int, ...]) -> list[str]:
        lines: list[str] = []
        for i in nodes:
            node = self.k.nodes[i]
            assert isinstance(node, Pointwise)
            w = self.writer()
            lines += w.emit([node.body])
            lines += self.store(node.out, w.ref(node.body), node.body.dtype, full=False)
        return lines

    def loop_stage(self, nodes: tuple[int, ...]) -> list[str]:
        looped = self.variant.kind == "looped"
        init: list[str] = []
        inner: list[str] = self.r_block("roffset + tl.arange(0, RBLOCK)[None, :]") if looped else []
        after: list[str] = []
        for i in nodes:
            node = self.k.nodes[i]
            if isinstance(node, Scatter):
                raise ValueError(f"{self.k.name}: a scatter inside a reduction kernel")
            w = self.writer()
            inner += w.emit([node.body])
            value = w.ref(node.body)
            if isinstance(node, Pointwise):
                inner += self.store(node.out, value, node.body.dtype, full=node.out.shape != self.k.ranges)
                continue
            assert isinstance(node, Reduction)
            red = _Reduce(node, f"acc{i}", value[0])
            if looped:
                init += red.init()
                inner += red.update()
                after += red.finish_lanes(self.helpers)
            else:
                inner += red.whole(self.helpers)
            results = red.results()
            for out, res in zip(node.outs, results, strict=True):
                after_store = self.store(out, (res, X), red.result_dtype(), full=False)
                (after if looped else inner).extend(after_store)
        for name in [n for n, v in self.values.items() if v[2]]:
            del self.values[name]  # a full value lives only within its pass
        if not looped:
            return inner
        return [*init, "for roffset in range(0, rnumel, RBLOCK):", *("    " + x for x in inner), *after]

    def scatter_body(self, node: Scatter) -> list[str]:
        w = self.writer()
        lines = w.emit([*node.index, node.value])
        spec = self.specs[node.target]
        offset, shape = flat([w.ref(e) for e in node.index], spec)
        if shape != X:
            offset = f"tl.full([XBLOCK], 0, {self.index_type()}) + {offset}"
        value = w.ref(node.value)[0]
        v = f"{value}.to({TL[spec.dtype]})"
        ptr = f"{node.target} + {offset}"
        if not node.accumulate:
            return [*lines, f"tl.store({ptr}, {v}, xmask)"]
        if spec.dtype not in (DType.F32, DType.F64, DType.F16, DType.I32, DType.I64):
            raise ValueError(f"{self.k.name}: an accumulating scatter into {spec.dtype.value} needs an "
                             "atomic add Triton does not have")
        # Note: atomics make duplicate indices add up in an unspecified order (a float sum may
        # differ in the last bits from run to run); a plain scatter's duplicates race likewise.
        return [*lines, f"tl.atomic_add({ptr}, {v}, xmask)"]


def _unflatten(flat_name: str, prefix: str, sizes: tuple[int, ...], first: int = 0) -> list[str]:
    """`<prefix><first + n> = ...` for each loop n of a row-major flat index over sizes."""
    lines = []
    inner = 1
    for n in reversed(range(len(sizes))):
        size = sizes[n]
        if size == 1:
            text = f"{flat_name} * 0"
        elif n == 0:
            text = f"{flat_name} // {inner}" if inner > 1 else flat_name
        else:
            text = f"({flat_name} // {inner}) % {size}" if inner > 1 else f"{flat_name} % {size}"
        lines.append(f"{prefix}{first + n} = {text}")
        inner *= size
    return list(reversed(lines))


def flat(idx: list[tuple[str, Shape]], spec: Buffer) -> tuple[str, Shape]:
    terms = []
    shape: Shape = NO_SHAPE
    for (i, s), stride, size in zip(idx, spec.stride, spec.shape, strict=True):
        if stride == 0 or size == 1:
            continue
        terms.append(f"{i} * {stride}" if stride != 1 else i)
        shape |= s
    if not terms:
        return "0", NO_SHAPE
    return (terms[0] if len(terms) == 1 else "(" + " + ".join(terms) + ")"), shape


# -- reductions ----------------------------------------------------------------------------------

_COMBINE = {
    ReduceOp.PROD: '''@triton.jit
def _kiln_prod(a, b):
    return a * b''',
    ReduceOp.WELFORD: '''@triton.jit
def _kiln_welford(mean_a, m2_a, n_a, mean_b, m2_b, n_b):
    # Chan et al.'s combination of two partial (mean, m2, count) results.
    n = n_a + n_b
    w = tl.where(n == 0, 0.0, n_b / tl.where(n == 0, 1.0, n))
    d = mean_b - mean_a
    return mean_a + d * w, m2_a + m2_b + d * d * n_a * w, n''',
    ReduceOp.ARGMAX: '''@triton.jit
def _kiln_argmax(a, ai, b, bi):
    # The first index of the largest value; a NaN beats everything; index -1: no value yet.
    beats = (b > a) | ((b != b) & (a == a))
    same = (a == b) | ((a != a) & (b != b))
    take = (bi != -1) & ((ai == -1) | beats | (same & (bi < ai)))
    return tl.where(take, b, a), tl.where(take, bi, ai)''',
    ReduceOp.ARGMIN: '''@triton.jit
def _kiln_argmin(a, ai, b, bi):
    beats = (b < a) | ((b != b) & (a == a))
    same = (a == b) | ((a != a) & (b != b))
    take = (bi != -1) & ((ai == -1) | beats | (same & (bi < ai)))
    return tl.where(take, b, a), tl.where(take, bi, ai)''',
}
HELPERS.update({f"_kiln_{op.value}": text for op, text in _COMBINE.items()})


class _Reduce:
    """One reduction's accumulator code: whole-block (persistent) or per lane (looped)."""

    def __init__(self, node: Reduction, acc: str, value: str) -> None:
        self.node = node
        self.acc = acc
        dtype = node.body.dtype
        if dtype.is_half:
            raise ValueError("a reduction accumulates in fp16/bf16; lowering should accumulate in fp32")
        if dtype is DType.BOOL and node.op not in (ReduceOp.ANY, ReduceOp.ALL):
            raise ValueError(f"{node.op.value} over bool values reaches codegen; lowering should cast them")
        self.t = rep(dtype)
        self.v = cast_text(value, dtype, DType.BOOL) if node.op in (ReduceOp.ANY, ReduceOp.ALL) \
            else f"{value}.to({self.t})"
        self.m = "(xmask & rmask)"

    def result_dtype(self) -> DType:
        if self.node.op in (ReduceOp.ARGMAX, ReduceOp.ARGMIN):
            return DType.I64
        return self.node.body.dtype

    def results(self) -> list[str]:
        return [f"{self.acc}_mean", f"{self.acc}_m2"] if self.node.op is ReduceOp.WELFORD else [self.acc]

    def identity(self) -> str:
        dtype = self.node.body.dtype
        if dtype.is_float:
            low, high = 'float("-inf")', 'float("inf")'
        else:
            bits = dtype.itemsize * 8
            low, high = (str(0), str(2**bits - 1)) if dtype is DType.U8 else \
                (str(-(2 ** (bits - 1))), str(2 ** (bits - 1) - 1))
        return {ReduceOp.SUM: "0", ReduceOp.PROD: "1", ReduceOp.MAX: low, ReduceOp.MIN: high,
                ReduceOp.ARGMAX: low, ReduceOp.ARGMIN: high}[self.node.op]

    def whole(self, helpers: set[str]) -> list[str]:
        """The reduction of a whole [XBLOCK, RBLOCK] block (persistent)."""
        op, a, v, m = self.node.op, self.acc, self.v, self.m
        if op is ReduceOp.SUM:
            return [f"{a} = tl.sum(tl.where({m}, {v}, 0), 1)[:, None]"]
        if op in (ReduceOp.ANY, ReduceOp.ALL):
            return self._any_all(f"tl.where({m}, {v}, {op is ReduceOp.ALL})")
        if op is ReduceOp.WELFORD:
            return [f"{a}_mean = tl.sum(tl.where({m}, {v}, 0), 1)[:, None] / rnumel",
                    f"{a}_d = tl.where({m}, {v} - {a}_mean, 0)",
                    f"{a}_m2 = tl.sum({a}_d * {a}_d, 1)[:, None]"]
        if op in (ReduceOp.ARGMAX, ReduceOp.ARGMIN):
            fn = self._helper(helpers)
            return [f"{a}_v, {a}_i = tl.reduce((tl.where({m}, {v}, {self.identity()}), "
                    f"tl.where({m}, rindex, -1)), 1, {fn})", f"{a} = {a}_i[:, None]"]
        fn = self._helper(helpers)
        return [f"{a} = tl.reduce(tl.where({m}, {v}, {self.identity()}), 1, {fn})[:, None]"]

    def _helper(self, helpers: set[str]) -> str:
        op = self.node.op
        fn = {ReduceOp.MAX: "_kiln_maximum", ReduceOp.MIN: "_kiln_minimum"}.get(op, f"_kiln_{op.value}")
        helpers.add(fn)
        return fn

    def _any_all(self, block: str) -> list[str]:
        a = self.acc
        if self.node.op is ReduceOp.ANY:
            return [f"{a} = (tl.sum(({block}).to(tl.int32), 1) > 0)[:, None]"]
        return [f"{a} = (tl.sum((({block}) == 0).to(tl.int32), 1) == 0)[:, None]"]

    def init(self) -> list[str]:
        a, op, t = self.acc, self.node.op, self.t
        full = "[XBLOCK, RBLOCK]"
        if op is ReduceOp.WELFORD:
            return [f"{a}_lmean = tl.zeros({full}, {t})", f"{a}_lm2 = tl.zeros({full}, {t})",
                    f"{a}_ln = tl.zeros({full}, {t})"]
        if op in (ReduceOp.ARGMAX, ReduceOp.ARGMIN):
            return [f"{a}_l = tl.full({full}, {self.identity()}, {t})",
                    f"{a}_li = tl.full({full}, -1, tl.int64)"]
        if op in (ReduceOp.ANY, ReduceOp.ALL):
            return [f"{a}_l = tl.full({full}, {op is ReduceOp.ALL}, tl.int1)"]
        return [f"{a}_l = tl.full({full}, {self.identity()}, {t})"]

    def update(self) -> list[str]:
        """Fold this chunk into the lane accumulators (masked lanes keep theirs)."""
        a, op, v, m = self.acc, self.node.op, self.v, self.m
        if op is ReduceOp.SUM:
            return [f"{a}_l = {a}_l + tl.where({m}, {v}, 0)"]
        if op is ReduceOp.PROD:
            return [f"{a}_l = {a}_l * tl.where({m}, {v}, 1)"]
        if op in (ReduceOp.MAX, ReduceOp.MIN):
            fn = "_kiln_maximum" if op is ReduceOp.MAX else "_kiln_minimum"
            return [f"{a}_l = tl.where({m}, {fn}({a}_l, {v}), {a}_l)"]
        if op is ReduceOp.ANY:
            return [f"{a}_l = {a}_l | tl.where({m}, {v}, False)"]
        if op is ReduceOp.ALL:
            return [f"{a}_l = {a}_l & tl.where({m}, {v}, True)"]
        if op is ReduceOp.WELFORD:
            return [f"{a}_x = {v}", f"{a}_ln = tl.where({m}, {a}_ln + 1, {a}_ln)",
                    f"{a}_d = {a}_x - {a}_lmean",
                    f"{a}_lmean = tl.where({m}, {a}_lmean + {a}_d / tl.where({m}, {a}_ln, 1), {a}_lmean)",
                    f"{a}_lm2 = tl.where({m}, {a}_lm2 + {a}_d * ({a}_x - {a}_lmean), {a}_lm2)"]
        better = ">" if op is ReduceOp.ARGMAX else "<"
        return [f"{a}_x = {v}",
                f"{a}_take = {m} & (({a}_li == -1) | ({a}_x {better} {a}_l)"
                f" | (({a}_x != {a}_x) & ({a}_l == {a}_l)))",
                f"{a}_l = tl.where({a}_take, {a}_x, {a}_l)",
                f"{a}_li = tl.where({a}_take, rindex.to(tl.int64), {a}_li)"]

    def finish_lanes(self, helpers: set[str]) -> list[str]:
        a, op = self.acc, self.node.op
        if op is ReduceOp.SUM:
            return [f"{a} = tl.sum({a}_l, 1)[:, None]"]
        if op in (ReduceOp.ANY, ReduceOp.ALL):
            return self._any_all(f"{a}_l")
        fn = self._helper(helpers)
        if op is ReduceOp.WELFORD:
            return [f"{a}_mean, {a}_m2, {a}_n = tl.reduce(({a}_lmean, {a}_lm2, {a}_ln), 1, {fn})",
                    f"{a}_mean = {a}_mean[:, None]", f"{a}_m2 = {a}_m2[:, None]"]
        if op in (ReduceOp.ARGMAX, ReduceOp.ARGMIN):
            return [f"{a}_v, {a}_i = tl.reduce(({a}_l, {a}_li), 1, {fn})", f"{a} = {a}_i[:, None]"]
        return [f"{a} = tl.reduce({a}_l, 1, {fn})[:, None]"]


# -- running under the interpreter -----------------------------------------------------------------

def interpreter_libdevice() -> Any:
    """Stand-ins for the libdevice functions the generated code calls, for TRITON_INTERPRET=1.

    Note: triton's interpreter (3.6 to 3.9) cannot run `extern_elementwise`, and its libdevice
    stubs return None, so a kernel run under the interpreter gets these numpy versions bound
    to its module's `libdevice` name instead; compiled kernels call the real libdevice.
    """
    import types

    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    def wrap(fn: Any) -> Any:
        def apply(*args: Any) -> Any:
            if len(args) == 2:
                args = tuple(tl.broadcast(args[0], args[1]))
            data = [x.handle.data for x in args]
            out = np.asarray(fn(*data)).astype(data[0].dtype)
            dtype = args[0].dtype
            ty = tl.block_type(dtype, list(out.shape)) if out.ndim else dtype
            return tl.core.tensor(TensorHandle(out, dtype.scalar), ty)
        return apply

    def erfinv(x: Any) -> Any:
        return torch.erfinv(torch.from_numpy(np.ascontiguousarray(x))).numpy()

    def erfc(x: Any) -> Any:
        return torch.erfc(torch.from_numpy(np.ascontiguousarray(x))).numpy()

    fns = {"expm1": np.expm1, "log10": np.log10, "log1p": np.log1p, "tan": np.tan, "asin": np.arcsin,
           "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh,
           "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "erfinv": erfinv,
           "erfc": erfc, "copysign": np.copysign, "rint": np.rint, "trunc": np.trunc,
           "atan2": np.arctan2, "pow": np.power, "fmod": np.fmod}
    return types.SimpleNamespace(**{name: wrap(fn) for name, fn in fns.items()})
