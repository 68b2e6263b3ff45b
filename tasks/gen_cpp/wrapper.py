"""The wrapper: one C++ function per scheduled graph, run by runtime/kiln_runtime.h.

    void graph_0(kiln::Context& ctx, void* const* args, void* const* results) {
      char* arena = ctx.arena(0);
      void* b_x = args[0];                      // user inputs, then weights
      void* b_buf0 = arena + 0;                 // temporaries at their planned offsets
      void* b_buf7 = results[0];                // outputs: the caller's memory
      { // addmm (linear)
        ... kiln::addmm(out, ...) through torch's C shim ...
      }
      kiln_4f0c...(static_cast<const float*>(b_buf0), static_cast<float*>(b_buf1));  // k1
    }

A graph's buffers are raw pointers with layouts fixed at compile time; tensors exist only at
the shim calls. Control flow runs in C++: a `cond` calls one branch's graph with the step's
outputs as its results; a `while_loop` keeps its carried values in two staging sets and swaps
them after each iteration, since a body may read a carried value while it writes the next.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tasks.ir.dtypes import DType
from tasks.ir.nodes import (
    Buffer,
    BufferKind,
    Cond,
    Extern,
    ExternOp,
    Fallback,
    View,
    channels_last_strides,
    contiguous_strides,
    is_dense,
    same_layout,
)
from tasks.schedule.epilogues import marked_pairs
from tasks.schedule.model import (
    CallStep,
    CondStep,
    Kernel,
    KernelStep,
    Schedule,
    ScheduledGraph,
    WhileStep,
)

MAX_DIMS = 12  # kiln::kMaxDims
_DTYPE = {d: f"kiln::DType::{d.name.replace('BOOL', 'B8')}" for d in DType}


class WrapperError(ValueError):
    pass


class Launcher(Protocol):
    """What a target supplies to the wrapper (tasks/targets/*/launch.py): how a kernel runs."""

    target: str

    def call(self, k: Kernel, names: GraphNames, index: int) -> list[str]:
        """The C++ lines that run kernel `k` (the `index`th distinct kernel, by first launch)."""

    def fused(self, call: Extern, k: Kernel) -> str | None:
        """Where the target runs a matmul call and its epilogue kernel `k` (a pair the schedule
        marked, ScheduledGraph.epilogues) as one kernel: that kernel's key; None: apart."""

    def call_fused(self, call: Extern, k: Kernel, names: GraphNames, index: int) -> list[str]:
        """The C++ lines that run the pair as the one kernel `fused` named (the `index`th)."""

    def prototypes(self, kernels: Mapping[str, Kernel]) -> list[str]:
        """The extern "C" declarations the calls need."""

    def table_rows(self, kernels: Mapping[str, Kernel]) -> list[str]:
        """Rows of the kernel table the runtime loads at create (kiln::CubinKernel), if any."""


BOXED_HEADER = "kiln_boxed.h"  # link builds and links kiln_boxed.cpp for a wrapper that includes it


@dataclass
class Layout:
    """Shape, strides and dtype: what a pointer means."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: DType

    @classmethod
    def of(cls, b: Buffer | View) -> Layout:
        return cls(b.shape, b.stride, b.dtype)

    def same(self, other: Layout) -> bool:
        if self.shape != other.shape or self.dtype != other.dtype:
            return False
        return all(n <= 1 or a == b for n, a, b in zip(self.shape, self.stride, other.stride, strict=True))

    @property
    def nbytes(self) -> int:
        if any(n == 0 for n in self.shape):
            return 0
        span = 1 + sum((n - 1) * s for n, s in zip(self.shape, self.stride, strict=True))
        return span * self.dtype.itemsize


@dataclass
class WrapperWriter:
    schedule: Schedule
    launcher: Launcher
    functions: list[list[str]] = field(default_factory=list)
    arenas: list[int] = field(default_factory=list)
    scratch: list[int] = field(default_factory=list)
    kernels: dict[str, Kernel] = field(default_factory=dict)  # key -> a kernel with it
    fallbacks: int = 0
    boxed_calls: int = 0  # fallbacks whose op takes a Scalar: kiln's boxed call (kiln_boxed.h)
    views: int = 0  # view slots (kiln::view(ctx, slot, ...))

    def graph(self, g: ScheduledGraph, args: Sequence[str] | None = None) -> int:
        """Adds graph_<i>; returns i. `args[k]` names where graph input k comes from."""
        index = len(self.functions)
        self.functions.append([])
        self.arenas.append(g.arena_bytes)
        names = GraphNames(g, args or [f"args[{k}]" for k in range(len(g.inputs))])
        body = names.declarations()
        fused = self.fused_pairs(g)
        for i, step in enumerate(g.steps):
            if i in fused:
                body += self.fused_call(fused[i], names)
            elif i - 1 not in fused:  # an epilogue kernel runs inside its fused call
                body += self.step(step, names)
        self.functions[index] = [
            f"void graph_{index}(kiln::Context& ctx, void* const* args, void* const* results) {{",
            *(["  char* arena = kiln::arena(ctx, " + str(index) + ");"] if g.arena else []),
            *("  " + line for line in body),
            "  (void)ctx; (void)args; (void)results;",
            "}",
        ]
        return index

    def step(self, step: Any, names: GraphNames) -> list[str]:
        if isinstance(step, KernelStep):
            return self.kernel_call(self.schedule.kernel(step.kernel), names)
        if isinstance(step, CallStep):
            if isinstance(step.node, Extern):
                return extern_call(step.node, names, self)
            return self.fallback(step.node, names)
        if isinstance(step, Cond):
            return self.cond(step, names)
        return self.while_loop(step, names)

    def fused_pairs(self, g: ScheduledGraph) -> dict[int, tuple[str, Extern, Kernel]]:
        """The graph's matmul pairs the target runs as one kernel: call step -> that kernel's
        key, the call and the epilogue kernel."""
        found = {}
        for i, call, k in marked_pairs(self.schedule, g):
            key = self.launcher.fused(call, k)
            if key is not None:
                found[i] = (key, call, k)
        return found

    def fused_call(self, pair: tuple[str, Extern, Kernel], names: GraphNames) -> list[str]:
        key, call, k = pair
        self.kernels.setdefault(key, k)
        return self.launcher.call_fused(call, k, names, self.kernel_index(key))

    def kernel_call(self, k: Kernel, names: GraphNames) -> list[str]:
        self.kernels.setdefault(k.key, k)
        return self.launcher.call(k, names, self.kernel_index(k.key))

    def kernel_index(self, key: str) -> int:
        """Kernels are numbered in the order of their first launch."""
        return list(self.kernels).index(key)  # kernel_call registers a kernel at its first launch

    def fallback(self, node: Fallback, names: GraphNames) -> list[str]:
        from tasks.gen_cpp.fallback import fallback_call, uses_boxed_call  # torch: only when needed

        self.fallbacks += 1
        self.boxed_calls += uses_boxed_call(node)
        lines = [f"{{  // {node.target} ({_clean(node.origin)}): not compiled, called through the dispatcher"]
        inputs = []
        for i, v in enumerate(node.inputs):
            lines.append(f"  kiln::Tensor in{i} = {tensor_of(v, names)};")
            inputs.append(f"in{i}.get()")
        outs = []
        for j, b in enumerate(node.outs):
            lines.append(f"  kiln::Tensor out{j} = {tensor_of(_whole(b), names)};")
            outs.append(f"out{j}.get()")

        lines += ["  " + line for line in fallback_call(node, inputs, outs)]
        return [*lines, "}"]

    def staged(self, layout: Layout) -> str:
        """A scratch block for one value of `layout`."""
        self.scratch.append(layout.nbytes)
        return f"kiln::scratch(ctx, {len(self.scratch) - 1})"

    def adapt(self, source: str, have: Layout, want: Layout, lines: list[str]) -> str:
        """A pointer to `source` laid out as `want`: itself, or a restrided copy."""
        if have.same(want):
            return source
        target = self.staged(want)
        lines.append(copy_line(target, want, source, have))
        return target

    def cond(self, step: CondStep, names: GraphNames) -> list[str]:
        pred = names.at(step.pred)
        lines = [f"// cond ({_clean(step.origin)})",
                 f"if (kiln::truthy({pred}, {_DTYPE[step.pred.dtype]})) {{"]
        for sub, last in ((step.then_graph, False), (step.else_graph, True)):
            inner: list[str] = []
            args = [self.adapt(names.at(v), Layout.of(v), Layout.of(b), inner)
                    for v, b in zip(step.operands, sub.inputs, strict=True)]
            results = self.results_into(sub, [names[b.name] for b in step.outs], step.outs, inner)
            index = self.graph(sub, None)
            inner.insert(len(inner) - results.copies, _call(index, args, results.pointers))
            lines += ["  " + line for line in inner]
            lines.append("} else {" if not last else "}")
        return lines

    def results_into(self, sub: ScheduledGraph, targets: list[str], outs: Sequence[Buffer],
                     lines: list[str]) -> Results:
        """Where a subgraph writes each output: the target itself, or a staging block copied
        into the target after the call (when the subgraph's layout differs)."""
        produced = {b.name: b for b in sub.buffers}
        pointers: list[str] = []
        copies: list[str] = []
        for name, target, out in zip(sub.outputs, targets, outs, strict=True):
            have, want = Layout.of(produced[name]), Layout.of(out)
            if have.same(want):
                pointers.append(target)
                continue
            staging = self.staged(have)
            pointers.append(staging)
            copies.append(copy_line(target, want, staging, have))
        lines += copies
        return Results(pointers, len(copies))

    def while_loop(self, step: WhileStep, names: GraphNames) -> list[str]:
        body, cond = step.body_graph, step.cond_graph
        n = len(step.carried)
        carried = [Layout.of(b) for b in body.inputs[:n]]
        lines = [f"{{  // while_loop ({_clean(step.origin)})"]
        inner: list[str] = []
        sets = [[self.staged(lay) for lay in carried] for _ in range(2)]
        inner.append(f"void* cur[] = {{{', '.join(sets[0])}}};")
        inner.append(f"void* nxt[] = {{{', '.join(sets[1])}}};")
        for i, (v, lay) in enumerate(zip(step.carried, carried, strict=True)):
            inner.append(copy_line(f"cur[{i}]", lay, names.at(v), Layout.of(v)))
        extra = [names.at(v) for v in step.extra]
        loop: list[str] = []
        cond_args = [self.adapt(f"cur[{i}]", lay, Layout.of(b), loop)
                     for i, (lay, b) in enumerate(zip(carried, cond.inputs[:n], strict=True))]
        cond_extra = [self.adapt(e, Layout.of(v), Layout.of(b), inner)
                      for e, v, b in zip(extra, step.extra, cond.inputs[n:], strict=True)]
        body_extra = [self.adapt(e, Layout.of(v), Layout.of(b), inner)
                      for e, v, b in zip(extra, step.extra, body.inputs[n:], strict=True)]
        pred_buffer = next(b for b in cond.buffers if b.name == cond.outputs[0])
        pred = self.staged(Layout.of(pred_buffer))
        loop.append(_call(self.graph(cond), [*cond_args, *cond_extra], [pred]))
        loop.append(f"if (!kiln::truthy({pred}, {_DTYPE[pred_buffer.dtype]})) break;")
        staging: list[str] = []
        targets = [_with_layout(b, lay) for b, lay in zip(body.inputs[:n], carried, strict=True)]
        results = self.results_into(body, [f"nxt[{i}]" for i in range(n)], targets, staging)
        loop.append(_call(self.graph(body), [f"cur[{i}]" for i in range(n)] + body_extra, results.pointers))
        loop += staging
        loop.append("for (int i = 0; i < " + str(n) + "; ++i) std::swap(cur[i], nxt[i]);")
        inner.append("for (;;) {")
        inner += ["  " + line for line in loop]
        inner.append("}")
        for i, (b, lay) in enumerate(zip(step.outs, carried, strict=True)):
            inner.append(copy_line(names[b.name], Layout.of(b), f"cur[{i}]", lay))
        return [*lines, *("  " + line for line in inner), "}"]


@dataclass(frozen=True)
class Results:
    pointers: list[str]
    copies: int  # copy lines appended after the call's place


class GraphNames:
    """Buffer name -> the C++ pointer variable that holds it, in one graph function."""

    def __init__(self, g: ScheduledGraph, args: Sequence[str]) -> None:
        self.g = g
        self.args = args
        self.vars: dict[str, str] = {}
        self.layouts: dict[str, Buffer] = {}
        used: set[str] = set()
        for b in (*g.inputs, *g.buffers):
            var = _identifier(b.name, used)
            self.vars[b.name] = var
            self.layouts[b.name] = b

    def __getitem__(self, buffer: str) -> str:
        return self.vars[buffer]

    def declarations(self) -> list[str]:
        offsets = dict(self.g.arena)
        inputs = zip(self.g.inputs, self.args, strict=True)
        lines = [f"void* {self.vars[b.name]} = {src};" for b, src in inputs]
        for b in self.g.buffers:
            if b.name in self.g.outputs:
                lines.append(f"void* {self.vars[b.name]} = results[{self.g.outputs.index(b.name)}];")
            else:
                lines.append(f"void* {self.vars[b.name]} = arena + {offsets[b.name]};")
        return lines

    def at(self, v: View) -> str:
        """A pointer to a view's first element."""
        if v.offset == 0:
            return self.vars[v.buffer]
        return f"kiln::at({self.vars[v.buffer]}, {v.offset}, {v.dtype.itemsize})"


def _identifier(name: str, used: set[str]) -> str:
    base = "b_" + re.sub(r"\W", "_", name)
    var, n = base, 1
    while var in used:
        var, n = f"{base}_{n}", n + 1
    used.add(var)
    return var


def _clean(text: str) -> str:
    return re.sub(r"[^\w.\-, ]", "_", text)[:80]


def _whole(b: Buffer) -> View:
    return View(b.name, b.shape, b.stride, 0, b.dtype)


def _with_layout(b: Buffer, lay: Layout) -> Buffer:
    return Buffer(b.name, lay.shape, lay.stride, lay.dtype, b.device)


def _call(index: int, args: Sequence[str], results: Sequence[str]) -> str:
    a = f"void* const a{index}[] = {{{', '.join(args) or 'nullptr'}}};"
    r = f"void* const r{index}[] = {{{', '.join(results) or 'nullptr'}}};"
    return f"{{ {a} {r} graph_{index}(ctx, a{index}, r{index}); }}"


def _ints(values: Sequence[int]) -> str:
    return "{" + ", ".join(str(int(v)) for v in values) + "}"


def copy_line(dst: str, dst_layout: Layout, src: str, src_layout: Layout) -> str:
    if dst_layout.shape != src_layout.shape or dst_layout.dtype != src_layout.dtype:
        raise WrapperError(f"cannot copy {src_layout} into {dst_layout}")
    nd = len(dst_layout.shape)
    if nd == 0:
        return f"kiln::copy_bytes({dst}, {src}, {dst_layout.dtype.itemsize});"
    return ("{ const int64_t ds[] = " + _ints(dst_layout.stride) + ", ss[] = " + _ints(src_layout.stride)
            + ", n[] = " + _ints(dst_layout.shape) + f"; kiln::copy_strided({dst}, ds, {src}, ss, n, {nd}, "
            f"{dst_layout.dtype.itemsize}); }}")


def tensor_of(v: View, names: GraphNames, slot: int | None = None) -> str:
    """A tensor over a view: a fresh one, or the one kept in a view slot of the model."""
    if len(v.shape) > MAX_DIMS:
        raise WrapperError(f"a {len(v.shape)}-d tensor: kiln's runtime takes at most {MAX_DIMS} dimensions")
    where = "" if slot is None else f"ctx, {slot}, "
    return f"kiln::view({where}{names.at(v)}, {_DTYPE[v.dtype]}, {_ints(v.shape)}, {_ints(v.stride)})"


def _double(value: Any) -> str:
    x = float(value)
    if math.isnan(x):
        return "std::numeric_limits<double>::quiet_NaN()"
    if math.isinf(x):
        return ("" if x > 0 else "-") + "std::numeric_limits<double>::infinity()"
    return x.hex()


def extern_call(node: Extern, names: GraphNames, w: WrapperWriter) -> list[str]:
    what = f"{node.op.value} ({_clean(node.origin)})"
    params = json.loads(node.params)

    def slot() -> int:
        w.views += 1
        return w.views - 1

    lines = [f"{{  // {what}", f"  const kiln::Tensor& out = {tensor_of(_whole(node.out), names, slot())};"]
    ins: list[str] = []
    for i, v in enumerate(node.inputs):
        if v is None:
            ins.append("nullptr")
            continue
        lines.append(f"  const kiln::Tensor& in{i} = {tensor_of(v, names, slot())};")
        ins.append(f"in{i}")
    if w.launcher.target == "cuda" and on_cudnn(node):
        text = _cudnn_conv(ins, params, f'"{what}"', len(node.out.shape) - 2)
    else:
        text = _EXTERN_CALLS[node.op](ins, params, f'"{what}"')
    lines.append("  " + text + ";")
    return [*lines, "}"]


# Note: eager's convolution on the GPU runs on cuDNN (at::_convolution's Cudnn backend) for
# every 2-d and 3-d one but depthwise and transposed ones. Where kiln's has no bias, the runtime
# calls cudnn_convolution's .out overload, which writes into kiln's buffer, as eager's call
# does; at::convolution allocates its result, which the runtime then copies into kiln's buffer:
# a pass more per convolution, a fifth of resnet18's launches. Only where the call is eager's to
# the bit: a bias is added by eager after cuDNN, in place (at::convolution does the same); a
# channels-last input or weight makes eager pick channels-last algorithms, while the .out
# overload takes its layout from kiln's row-major buffer; a sample of more than 2^31 elements
# makes eager leave cuDNN. float16 and bfloat16 only: for float32, cuDNN's TF32 choice is a flag
# of the caller's process. The flags passed are eager's defaults (kiln_runtime.cpp).
def on_cudnn(node: Extern) -> bool:
    """Whether a convolution runs as cudnn_convolution(...).out on the cuda target."""
    params = json.loads(node.params)
    if node.op is not ExternOp.CONVOLUTION or params["transposed"]:
        return False
    if node.out.dtype not in (DType.F16, DType.BF16):
        return False
    x, weight, bias = node.inputs
    if x is None or weight is None or bias is not None or len(x.shape) not in (4, 5):
        return False
    if x.dtype is not node.out.dtype or weight.dtype is not node.out.dtype or 0 in x.shape + weight.shape:
        return False
    if not (_row_major(x) and _row_major(weight)) and not _channels_last(weight, x):
        return False
    per_sample = max(math.prod(x.shape[1:]), math.prod(node.out.shape[1:]))
    if per_sample > 2**31 - 1:
        return False
    groups, channels = int(params["groups"]), x.shape[1]
    return not (groups > 1 and channels == groups and weight.shape[0] % channels == 0)  # depthwise


def _channels_last(weight: View, x: View) -> bool:
    """A 2-d convolution's weight laid out channels-last (tasks/lower/layout.py), over a dense input:
    cuDNN's call takes both in channels-last, as eager's takes a channels-last model's."""
    if len(weight.shape) != 4:
        return False
    laid = same_layout(weight.shape, weight.stride, channels_last_strides(weight.shape))
    return laid and is_dense(x.shape, x.stride)


def _row_major(v: View) -> bool:
    return same_layout(v.shape, v.stride, contiguous_strides(v.shape))


def _cudnn_conv(ins: list[str], p: Mapping[str, Any], what: str, dims: int) -> str:
    """The call, with stride, padding and dilation given for each of the `dims` spatial dims (a
    convolution may carry one value for all, which at::convolution widens and
    cudnn_convolution refuses)."""
    def spatial(name: str) -> str:
        values = list(p[name])
        return _ints(values * dims if len(values) == 1 else values)

    return (f"kiln::cudnn_convolution(out, {ins[0]}, {ins[1]}, {spatial('stride')}, {spatial('padding')}, "
            f"{spatial('dilation')}, {int(p['groups'])}, {what})")


def _opt(name: str) -> str:
    return "nullptr" if name == "nullptr" else f"&{name}"


def _sdpa(ins: list[str], p: Mapping[str, Any], what: str) -> str:
    scale, prefix = "nullptr", ""
    if p.get("scale") is not None:
        prefix = f"const double s = {_double(p['scale'])}; "
        scale = "&s"
    mask = ins[3] if len(ins) > 3 else "nullptr"
    return (f"{prefix}kiln::attention(out, {ins[0]}, {ins[1]}, {ins[2]}, {_opt(mask)}, "
            f"{_double(p.get('dropout_p', 0.0))}, {str(bool(p.get('is_causal'))).lower()}, {scale}, {what})")


def _conv(ins: list[str], p: Mapping[str, Any], what: str) -> str:
    bias = ins[2] if len(ins) > 2 else "nullptr"
    return (f"kiln::convolution(out, {ins[0]}, {ins[1]}, {_opt(bias)}, {_ints(p['stride'])}, "
            f"{_ints(p['padding'])}, {_ints(p['dilation'])}, {str(bool(p['transposed'])).lower()}, "
            f"{_ints(p['output_padding'])}, {int(p['groups'])}, {what})")


_EXTERN_CALLS: dict[ExternOp, Callable[[list[str], Mapping[str, Any], str], str]] = {
    ExternOp.MM: lambda i, p, w: f"kiln::mm(out, {i[0]}, {i[1]}, {w})",
    ExternOp.BMM: lambda i, p, w: f"kiln::bmm(out, {i[0]}, {i[1]}, {w})",
    ExternOp.ADDMM: lambda i, p, w: (f"kiln::addmm(out, {i[0]}, {i[1]}, {i[2]}, {_double(p['beta'])}, "
                                     f"{_double(p['alpha'])}, {w})"),
    ExternOp.BADDBMM: lambda i, p, w: (f"kiln::baddbmm(out, {i[0]}, {i[1]}, {i[2]}, {_double(p['beta'])}, "
                                       f"{_double(p['alpha'])}, {w})"),
    ExternOp.CONVOLUTION: _conv,
    ExternOp.SDPA: _sdpa,
}


# -- the file --------------------------------------------------------------------------------

def spec_line(name: str, b: Buffer | Layout) -> str:
    shape, stride = b.shape, b.stride
    if len(shape) > MAX_DIMS:
        raise WrapperError(f"{name}: a {len(shape)}-d tensor; kiln's runtime takes {MAX_DIMS} at most")
    return f"  {{{json.dumps(name)}, {_DTYPE[b.dtype]}, {len(shape)}, {_ints(shape)}, {_ints(stride)}}},"


def _write_row(value: Buffer, target: str, users: list[Buffer], weights: list[Buffer]) -> str:
    """A kiln::Write: the value's layout, and the input or weight it is copied into."""
    spec = spec_line(f"write:{target}", value).strip().rstrip(",")
    user_names = [b.name for b in users]
    if target in user_names:
        return f"  {{{spec}, 0, {user_names.index(target)}}},"
    return f"  {{{spec}, 1, {[b.name for b in weights].index(target)}}},"


def _table(ctype: str, name: str, rows: list[str]) -> list[str]:
    if not rows:
        return [f"const {ctype}* const {name} = nullptr;"]
    return [f"const {ctype} {name}[] = {{", *rows, "};"]


def wrapper_source(schedule: Schedule, launcher: Launcher, isa: str = "x86-64") -> str:
    main = schedule.main
    users = [b for b in main.inputs if b.kind is not BufferKind.WEIGHT]
    weights = [b for b in main.inputs if b.kind is BufferKind.WEIGHT]
    for b in weights:  # the runtime lays a weight out from the file's row-major bytes at create
        if not is_dense(b.shape, b.stride) and b.numel > 1:
            raise WrapperError(f"weight {b.name} has strides {b.stride}, which overlap or leave gaps; kiln "
                               "lays weights out as a permutation of their dims only: make the parameter "
                               "contiguous (or one whose dims permuted are)")
    order = {b.name: i for i, b in enumerate([*users, *weights])}
    writer = WrapperWriter(schedule, launcher)
    writer.graph(main, [f"args[{order[b.name]}]" for b in main.inputs])
    produced = {b.name: b for b in main.buffers}
    outputs = [produced[name] for name in main.user_outputs()]
    outs = [spec_line(f"output{i}", b) for i, b in enumerate(outputs)]
    written = main.outputs[len(outputs):]
    lines = [*_preamble(writer)]
    for fn in writer.functions:
        lines += [*fn, ""]
    lines += _table("kiln::TensorSpec", "kInputs", [spec_line(b.name, b) for b in users])
    lines += _table("kiln::TensorSpec", "kWeights", [spec_line(b.weight, b) for b in weights])
    lines += _table("kiln::TensorSpec", "kOutputs", outs)
    lines += _table("kiln::Write", "kWrites", [_write_row(produced[value], target, users, weights)
                                               for value, target in zip(written, main.writes, strict=True)])
    lines += [f"const size_t kArenas[] = {_ints(writer.arenas)};"]
    lines += _table("size_t", "kScratch", [f"  {n}," for n in writer.scratch])
    kernel_rows = launcher.table_rows(writer.kernels)
    lines += _table("kiln::CubinKernel", "kKernels", kernel_rows)
    counts = (len(users), len(weights), len(outputs), len(writer.arenas), len(writer.scratch), writer.views)
    lines += [
        "",
        "}  // namespace",
        "",
        "namespace kiln {",
        "const Program program = {{kInputs, {}, kWeights, {}, kOutputs, {},".format(*counts[:3]),
        "                         kArenas, {}, kScratch, {}, {}, graph_0, {}, {},".format(
            *counts[3:], json.dumps(launcher.target), json.dumps(isa)),
        f"                         kKernels, {len(kernel_rows)}, kWrites, {len(written)}}};",
        "}  // namespace kiln",
        "",
    ]
    return "\n".join(lines)


def _preamble(w: WrapperWriter) -> list[str]:
    """Includes, the kernels' prototypes and every graph function's declaration."""
    prototypes = w.launcher.prototypes(w.kernels)
    return [
        "// The wrapper of a model compiled by kiln (generated by tasks/gen_cpp; do not edit).",
        '#include "kiln_runtime.h"',
        *(['#include "kiln_fallback.h"'] if w.fallbacks else []),
        *([f'#include "{BOXED_HEADER}"'] if w.boxed_calls else []),
        "",
        "#include <limits>",
        "",
        'extern "C" {',
        *prototypes,
        "}",
        "",
        "namespace {",
        "",
        *(f"void graph_{i}(kiln::Context& ctx, void* const* args, void* const* results);"
          for i in range(len(w.functions))),
        "",
    ]
