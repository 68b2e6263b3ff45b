"""A scheduled kernel as a C++ function: OpenMP over the outer loops of X, stages per row.

    extern "C" void kiln_k3(const float* __restrict in0, float* __restrict out0) {
      #pragma omp parallel for collapse(1) schedule(static)
      for (int64_t i0 = 0; i0 < 128; ++i0) {
        ... row stages and passes over R (see tasks/schedule/kernel_loops.py) ...
      }
    }

A `CpuVariant` picks how many outer loops are parallel and whether the innermost loop (a
pointwise kernel's last X loop, or a pass's last R loop) carries `omp simd`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tasks.codegen.cpp_expr import CTYPES, ExprWriter, cast_text
from tasks.ir.dtypes import DType
from tasks.ir.expr import Expr
from tasks.ir.nodes import Buffer, Pointwise, ReduceOp, Reduction, Scatter
from tasks.schedule.model import Kernel, KernelNode


@dataclass(frozen=True, slots=True)
class CpuVariant:
    parallel: int = 1  # how many outer X loops share the threads (collapse); 0: serial
    simd: bool = True  # `omp simd` on the innermost loop
    # Each pass over R split across the threads, with per-thread partials combined in thread
    # order afterwards (deterministic for a given thread count): for kernels with few rows.
    split_r: bool = False

    @property
    def name(self) -> str:
        return f"par{self.parallel}{'_simd' if self.simd else ''}{'_splitr' if self.split_r else ''}"


def function_name(k: Kernel) -> str:
    return f"kiln_{k.name}"


def kernel_source(k: Kernel, variant: CpuVariant, function: str | None = None) -> str:
    params = ", ".join(param_decl(p.spec, p.role) for p in k.params)
    includes = ['#include "kiln_cpu.h"']
    if variant.split_r:
        includes += ["#include <omp.h>", "#include <memory>"]
    lines = [*includes, "", f'extern "C" void {function or function_name(k)}({params}) {{']
    if len(k.nodes) == 1 and isinstance(k.nodes[0], Scatter):
        body = _scatter_body(k, k.nodes[0])
    elif not k.reduce_ranges:
        body = _pointwise_body(k, variant)
    else:
        body = _reduction_body(k, variant)
    lines += ["  " + line for line in body]
    lines.append("}")
    return "\n".join(lines) + "\n"


def param_decl(b: Buffer, role: str) -> str:
    const = "const " if role == "in" else ""
    return f"{const}{CTYPES[b.dtype]}* __restrict {b.name}"


class KernelWriter:
    """Names and loads for one kernel: params through their strides, locals by variable."""

    def __init__(self, k: Kernel) -> None:
        self.k = k
        self.specs = {p.name: p.spec for p in k.params}
        self.locals = {b.name: b for b in k.locals}
        self.ranges = {f"i{n}": s for n, s in enumerate(k.ranges)}
        self.ranges.update({f"r{n}": s for n, s in enumerate(k.reduce_ranges)})
        self.counter = 0

    def writer(self) -> ExprWriter:
        self.counter += 1
        return ExprWriter(self.load, self.ranges, prefix=f"n{self.counter}_")

    def load(self, e: Expr, idx: list[str], guard: str | None) -> str:
        name = str(e.arg)
        if name in self.locals:
            return name
        spec = self.specs[name]
        text = f"{name}[{flat(idx, spec)}]"
        if guard is None:
            return text
        return f"(({guard}) ? {text} : {CTYPES[spec.dtype]}(0))"

    def store(self, out: Buffer, value: str, idx: list[str]) -> str:
        if out.name in self.locals:
            return f"{out.name} = {value};"
        return f"{out.name}[{flat(idx, self.specs[out.name])}] = {value};"


def flat(idx: list[str], spec: Buffer) -> str:
    terms = [f"{i} * {s}LL" if s != 1 else i for i, s, n in zip(idx, spec.stride, spec.shape, strict=True)
             if s != 0 and n != 1]
    return " + ".join(terms) if terms else "0"


def _loops(names: list[str], sizes: tuple[int, ...], parallel: int, simd_last: bool) -> list[str]:
    lines = []
    parallel = min(parallel, len(sizes))
    for n, (name, size) in enumerate(zip(names, sizes, strict=True)):
        if n == 0 and parallel:
            simd = " simd" if simd_last and parallel == len(sizes) == 1 else ""
            lines.append(f"#pragma omp parallel for{simd} collapse({parallel}) schedule(static)")
        elif n == len(sizes) - 1 and simd_last and n >= parallel:
            lines.append("#pragma omp simd")
        lines.append(f"for (int64_t {name} = 0; {name} < {size}LL; ++{name})")
    return lines


def _pointwise_body(k: Kernel, variant: CpuVariant) -> list[str]:
    kw = KernelWriter(k)
    names = [f"i{n}" for n in range(len(k.ranges))]
    inner: list[str] = []
    for node in k.nodes:
        assert isinstance(node, Pointwise)
        w = kw.writer()
        inner += w.emit([node.body])
        if node.out.name in kw.locals:
            inner.append(f"const {CTYPES[node.out.dtype]} {node.out.name} = {w.ref(node.body)};")
        else:
            inner.append(kw.store(node.out, w.ref(node.body), names))
    if not names:
        return ["{", *("  " + x for x in inner), "}"]
    return [*_loops(names, k.ranges, variant.parallel, variant.simd), "{", *("  " + x for x in inner), "}"]


def _reduction_body(k: Kernel, variant: CpuVariant) -> list[str]:
    kw = KernelWriter(k)
    x_names = [f"i{n}" for n in range(len(k.ranges))]
    row: list[str] = []
    for b in k.locals:
        if b.shape == k.ranges:
            row.append(f"{CTYPES[b.dtype]} {b.name};")
    for stage in k.stages:
        if stage.loop:
            row += _pass(k, kw, stage.nodes, variant)
        else:
            for i in stage.nodes:
                node = k.nodes[i]
                assert isinstance(node, Pointwise)
                w = kw.writer()
                row += w.emit([node.body])
                row.append(kw.store(node.out, w.ref(node.body), x_names))
    if not x_names:
        return ["{", *("  " + x for x in row), "}"]
    parallel = 0 if variant.split_r else variant.parallel
    return [*_loops(x_names, k.ranges, parallel, False), "{", *("  " + x for x in row), "}"]


def _pass(k: Kernel, kw: KernelWriter, nodes: tuple[int, ...], variant: CpuVariant) -> list[str]:
    r_names = [f"r{n}" for n in range(len(k.reduce_ranges))]
    full_idx = [f"i{n}" for n in range(len(k.ranges))] + r_names
    before: list[str] = []
    inner: list[str] = []
    lane_inner: list[str] = []  # the same, updating one accumulator per lane (see _lane_pass)
    after: list[str] = []
    lane = f"[{r_names[-1]}_lane]" if r_names else ""
    for i in nodes:
        node = k.nodes[i]
        w = kw.writer()
        if isinstance(node, Pointwise):
            code = w.emit([node.body])
            if node.out.name in kw.locals:
                code.append(f"const {CTYPES[node.out.dtype]} {node.out.name} = {w.ref(node.body)};")
            else:
                code.append(kw.store(node.out, w.ref(node.body), full_idx))
            inner += code
            lane_inner += code
        else:
            assert isinstance(node, Reduction)
            acc = f"acc{i}"
            before += _acc_init(node, acc)
            code = w.emit([node.body])
            inner += code + _acc_update(node, acc, w.ref(node.body), r_names, k.reduce_ranges)
            lane_inner += code + _lane_update(node, acc, w.ref(node.body), lane)
            after += _acc_finish(node, acc, kw, [f"i{n}" for n in range(len(k.ranges))])
    reductions = [(i, k.nodes[i]) for i in nodes if isinstance(k.nodes[i], Reduction)]
    if variant.split_r:
        return _split_pass(k, reductions, before, inner, after)
    if variant.simd and reductions and _lanes_fit(k, reductions):
        return _lane_pass(k, reductions, lane_inner, after)
    simd = variant.simd and not reductions
    loops = _loops(r_names, k.reduce_ranges, 0, simd)
    return ["{", *("  " + x for x in before), *("  " + x for x in loops), "  {",
            *("    " + x for x in inner), "  }", *("  " + x for x in after), "}"]


LANES = 8  # accumulators per reduction in a vectorized pass: two SSE or one AVX vector of floats
_LANE_OPS = (ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.WELFORD)


def _lanes_fit(k: Kernel, reductions: list[tuple[int, KernelNode]]) -> bool:
    return k.reduce_ranges[-1] >= 2 * LANES and all(
        isinstance(n, Reduction) and n.op in _LANE_OPS and n.body.dtype.is_float for _, n in reductions)


def _lane_pass(k: Kernel, reductions: list[tuple[int, KernelNode]], lane_inner: list[str],
               after: list[str]) -> list[str]:
    """A pass over R whose last loop runs in chunks of LANES, one accumulator per lane, so the
    compiler vectorizes it; the lanes are combined at the end (and the tail goes to lane 0).

    Note: this reorders a float reduction (as eager's vectorized kernels do); a welford keeps
    a count per lane and lanes merge with Chan's formula, so its result is still exact Welford.
    """
    r_names = [f"r{n}" for n in range(len(k.reduce_ranges))]
    last, size = r_names[-1], k.reduce_ranges[-1]
    main = size // LANES * LANES
    nodes = {i: n for i, n in reductions if isinstance(n, Reduction)}
    init = [line for i, node in nodes.items() for line in _lane_init(node, f"acc{i}")]
    combine = [line for i, node in nodes.items() for line in _lane_combine(node, f"acc{i}")]
    outer = _loops(r_names[:-1], k.reduce_ranges[:-1], 0, False)
    body = [f"for (int64_t {last}_base = 0; {last}_base < {main}LL; {last}_base += {LANES})",
            "#pragma omp simd", f"for (int64_t {last}_lane = 0; {last}_lane < {LANES}; ++{last}_lane)", "{",
            f"  const int64_t {last} = {last}_base + {last}_lane;", *("  " + x for x in lane_inner), "}"]
    if main < size:
        body += [f"for (int64_t {last} = {main}LL; {last} < {size}LL; ++{last})", "{",
                 f"  const int64_t {last}_lane = 0;", *("  " + x for x in lane_inner), "}"]
    return ["{", *("  " + x for x in init), *("  " + x for x in outer),
            "  {", *("    " + x for x in body), "  }",
            *("  " + x for x in combine), *("  " + x for x in after), "}"]


def _lane_init(node: Reduction, acc: str) -> list[str]:
    t = CTYPES[node.body.dtype]
    if node.op is ReduceOp.WELFORD:
        return [f"{t} {acc}_mean[{LANES}] = {{}}, {acc}_m2[{LANES}] = {{}}, {acc}_n[{LANES}] = {{}};"]
    return [f"{t} {acc}_l[{LANES}];", f"for (int l = 0; l < {LANES}; ++l) {acc}_l[l] = {_identity(node)};"]


def _lane_update(node: Reduction, acc: str, v: str, lane: str) -> list[str]:
    """_acc_update onto the lane's accumulator (a welford keeps a count per lane)."""
    if node.op is not ReduceOp.WELFORD:
        return _acc_update(node, f"{acc}_l{lane}", v, [], ())
    m, m2, n = (f"{acc}_{part}{lane}" for part in ("mean", "m2", "n"))
    return [f"{{ {n} += 1; const auto d = {v} - {m}; {m} += d / {n}; {m2} += d * ({v} - {m}); }}"]


def _lane_combine(node: Reduction, acc: str) -> list[str]:
    t = CTYPES[node.body.dtype]
    if node.op is ReduceOp.WELFORD:
        return [f"kiln::Welford<{t}> {acc};", f"for (int l = 0; l < {LANES}; ++l) {{",
                f"  kiln::Welford<{t}> part;", f"  part.mean = {acc}_mean[l]; part.m2 = {acc}_m2[l];",
                f"  part.n = static_cast<int64_t>({acc}_n[l]);", f"  {acc}.merge(part);", "}"]
    return [f"{t} {acc} = {_identity(node)};",
            f"for (int l = 0; l < {LANES}; ++l) {{ {_acc_update(node, acc, f'{acc}_l[l]', [], ())[0]} }}"]


def _split_pass(k: Kernel, reductions: list[tuple[int, KernelNode]], before: list[str], inner: list[str],
                after: list[str]) -> list[str]:
    """One pass over R shared by the threads: partial accumulators per thread, then combined."""
    r_names = [f"r{n}" for n in range(len(k.reduce_ranges))]
    accs = [name for i, _ in reductions for name in _acc_names(k.nodes[i], f"acc{i}")]
    # Note: every slot starts as the identity: a team may have fewer threads than the maximum.
    keep = [f"std::unique_ptr<decltype({a})[]> part_{a}(new decltype({a})[kiln_threads]);" for a in accs]
    keep += [f"for (int kiln_u = 0; kiln_u < kiln_threads; ++kiln_u) part_{a}[kiln_u] = {a};" for a in accs]
    save = [f"part_{a}[kiln_t] = {a};" for a in accs]
    combine = []
    for i, node in reductions:
        assert isinstance(node, Reduction)
        combine += _acc_combine(node, f"acc{i}")
    loops = [f"#pragma omp for collapse({len(r_names)}) schedule(static)"]
    loops += [f"for (int64_t {n} = 0; {n} < {size}LL; ++{n})"
              for n, size in zip(r_names, k.reduce_ranges, strict=True)]
    return ["{", "  const int kiln_threads = omp_get_max_threads();", *("  " + x for x in before),
            *("  " + x for x in keep), "  #pragma omp parallel", "  {",
            "    const int kiln_t = omp_get_thread_num();", *("    " + x for x in before),
            *("    " + x for x in loops), "    {", *("      " + x for x in inner), "    }",
            *("    " + x for x in save), "  }", "  for (int kiln_u = 0; kiln_u < kiln_threads; ++kiln_u) {",
            *("    " + x for x in combine), "  }", *("  " + x for x in after), "}"]


def _acc_names(node: KernelNode, acc: str) -> list[str]:
    if isinstance(node, Reduction) and node.op in (ReduceOp.ARGMAX, ReduceOp.ARGMIN):
        return [acc, f"{acc}_at", f"{acc}_first"]
    return [acc]


def _acc_combine(node: Reduction, acc: str) -> list[str]:
    """Fold thread kiln_u's partial into acc; partials come in thread order, which is R order."""
    part = f"part_{acc}[kiln_u]"
    if node.op is ReduceOp.WELFORD:
        return [f"{acc}.merge({part});"]
    if node.op in (ReduceOp.ARGMAX, ReduceOp.ARGMIN):
        return [f"if (!part_{acc}_first[kiln_u] && {_beats(node, acc, part)}) "
                f"{{ {acc} = {part}; {acc}_at = part_{acc}_at[kiln_u]; {acc}_first = false; }}"]
    return _acc_update(node, acc, part, [], ())


def _identity(node: Reduction) -> str:
    t = node.body.dtype
    inf = f"std::numeric_limits<{CTYPES[t]}>::{'infinity()' if t.is_float else 'max()'}"
    low = f"-{inf}" if t.is_float else f"std::numeric_limits<{CTYPES[t]}>::lowest()"
    return {ReduceOp.SUM: "0", ReduceOp.PROD: "1", ReduceOp.MAX: low, ReduceOp.MIN: inf,
            ReduceOp.ANY: "false", ReduceOp.ALL: "true", ReduceOp.ARGMAX: low, ReduceOp.ARGMIN: inf}[node.op]


def _acc_init(node: Reduction, acc: str) -> list[str]:
    t = CTYPES[node.body.dtype]
    if node.body.dtype.is_half:
        raise ValueError("a reduction accumulates in fp16/bf16; lowering should accumulate in fp32")
    if node.op is ReduceOp.WELFORD:
        return [f"kiln::Welford<{t}> {acc};"]
    if node.op in (ReduceOp.ARGMAX, ReduceOp.ARGMIN):
        return [f"{t} {acc} = {_identity(node)};", f"int64_t {acc}_at = 0;", f"bool {acc}_first = true;"]
    return [f"{t} {acc} = {_identity(node)};"]


def _acc_update(node: Reduction, acc: str, v: str, r_names: list[str], sizes: tuple[int, ...]) -> list[str]:
    op = node.op
    if op is ReduceOp.SUM:
        return [f"{acc} += {v};"]
    if op is ReduceOp.PROD:
        return [f"{acc} *= {v};"]
    if op is ReduceOp.MAX:
        return [f"{acc} = kiln::maximum({acc}, {v});"]
    if op is ReduceOp.MIN:
        return [f"{acc} = kiln::minimum({acc}, {v});"]
    if op is ReduceOp.ANY:
        return [f"{acc} = {acc} || {v};"]
    if op is ReduceOp.ALL:
        return [f"{acc} = {acc} && {v};"]
    if op is ReduceOp.WELFORD:
        return [f"{acc}.add({v});"]
    at = " + ".join(f"{r} * {math.prod(sizes[n + 1:])}LL" for n, r in enumerate(r_names)) or "0"
    return [f"if ({_beats(node, acc, v)}) {{ {acc} = {v}; {acc}_at = {at}; {acc}_first = false; }}"]


def _beats(node: Reduction, acc: str, v: str) -> str:
    """Whether v replaces the best so far: the first index of the best value wins, and a NaN
    beats everything, as in torch.argmax."""
    better = ">" if node.op is ReduceOp.ARGMAX else "<"
    nan = f"({v} != {v} && {acc} == {acc})" if node.body.dtype.is_float else "false"
    return f"({acc}_first || {nan} || ({acc} == {acc} && {v} {better} {acc}))"


def _acc_finish(node: Reduction, acc: str, kw: KernelWriter, x_idx: list[str]) -> list[str]:
    if node.op is ReduceOp.WELFORD:
        mean, m2 = node.outs
        return [kw.store(mean, f"{acc}.mean", x_idx), kw.store(m2, f"{acc}.m2", x_idx)]
    (out,) = node.outs
    value = f"{acc}_at" if node.op in (ReduceOp.ARGMAX, ReduceOp.ARGMIN) else acc
    return [kw.store(out, cast_text(value, _acc_dtype(node), out.dtype), x_idx)]


def _acc_dtype(node: Reduction) -> DType:
    return DType.I64 if node.op in (ReduceOp.ARGMAX, ReduceOp.ARGMIN) else node.body.dtype


def _scatter_body(k: Kernel, node: Scatter) -> list[str]:
    # Note: scatters run serially: duplicate indices then add up (or the last write wins) the
    # same way every run, with no atomics, which fp16/bf16 have none of anyway.
    kw = KernelWriter(k)
    names = [f"i{n}" for n in range(len(node.ranges))]
    w = kw.writer()
    inner = w.emit([*node.index, node.value])
    spec = kw.specs[node.target]
    at = flat([w.ref(e) for e in node.index], spec)
    value = w.ref(node.value)
    if node.accumulate:
        t = spec.dtype
        if t.is_half:
            old = cast_text(f"{node.target}[{at}]", t, DType.F32)
            total = cast_text(f"{old} + {cast_text(value, t, DType.F32)}", DType.F32, t)
            inner.append(f"{node.target}[{at}] = {total};")
        else:
            inner.append(f"{node.target}[{at}] += {value};")
    else:
        inner.append(f"{node.target}[{at}] = {value};")
    loops = [f"for (int64_t {n} = 0; {n} < {s}LL; ++{n})" for n, s in zip(names, node.ranges, strict=True)]
    return [*loops, "{", *("  " + x for x in inner), "}"]

