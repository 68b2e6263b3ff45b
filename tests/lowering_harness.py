"""One aten op through its lowering, checked against eager: the harness of tests/test_lowerings.py.

`check_lowering(op, args, kwargs)` builds the graph a one-op program lowers to, without
torch.export: one INPUT buffer per tensor argument (its real shape and strides, so a transposed
or sliced tensor is read through its strides), the arguments bound by schema, the output meta
from the op run on fake tensors, and the lowering from the table. The graph is verified,
round-tripped through its JSON, run by the IR interpreter on the real tensors and compared with
the eager op's outputs.

Inputs are written as specs (`t(7, 5, dt="f16", lay="t")`, `idx(7, 9)`), made into tensors
when a case runs, so a table of cases costs nothing to build and every run sees the same data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tasks.ir import serialize
from tasks.ir.interpret import run_graph
from tasks.ir.nodes import Buffer, BufferKind, Graph
from tasks.ir.oracle import flat_outputs
from tasks.ir.verify import verify
from tasks.lower.context import Call, Lower
from tasks.lower.program import GraphLowering, bind, dtype_of, out_meta, target_name
from tasks.lower.registry import LOWERINGS
from tasks.lower.values import TensorValue

Tolerance = tuple[float, float]  # (rtol, atol)
# Note: fp16/bf16 compute in fp32 inside kiln and round once when stored, while eager may
# round in between (a composite op, an accumulation), so a result may be an ulp or two away.
TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (4e-3, 2e-3),
    torch.bfloat16: (2.5e-2, 1.6e-2),
}


def tree_map(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """fn applied to every tensor in value (lists and tuples of them too)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, list | tuple):
        return type(value)(tree_map(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: tree_map(v, fn) for k, v in value.items()}
    return value


def meta_outputs(op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """The op's result on fake tensors: shapes and dtypes only, no data touched.

    Note: fake CPU tensors, as torch.export traces with, not tensors on the meta device: some
    meta kernels answer for CUDA (native_layer_norm's fp16 statistics are fp32 on "meta" and
    fp16 on CPU), and a program exported on CPU carries the CPU answer.
    """
    with FakeTensorMode() as mode:
        return op(*tree_map(args, mode.from_tensor), **tree_map(dict(kwargs), mode.from_tensor))


def lower_op(op: torch._ops.OpOverload, args: tuple[Any, ...],
             kwargs: Mapping[str, Any]) -> tuple[Graph, dict[str, torch.Tensor]]:
    """The graph of a program that calls op once, and its inputs by buffer name."""
    name = target_name(op)
    lowering = LOWERINGS.get(name)
    assert lowering is not None, f"{name} has no lowering (this harness tests the table, not the fallback)"
    inputs: list[Buffer] = []
    feeds: dict[str, torch.Tensor] = {}

    def value(t: torch.Tensor) -> TensorValue:
        b = Buffer(f"in{len(inputs)}", tuple(t.shape), tuple(t.stride()), dtype_of(t.dtype), "cpu",
                   BufferKind.INPUT)
        inputs.append(b)
        feeds[b.name] = t
        return TensorValue.of(b)

    bound = bind(op, tree_map(args, value), tree_map(dict(kwargs), value))
    call = Call(name, "node", bound, out_meta(meta_outputs(op, args, kwargs), name))
    ctx = Lower("cpu")
    result = lowering(ctx, call)
    outputs = GraphLowering(ctx, lambda _node: "").finish_outputs(_values(result))
    return Graph(tuple(inputs), tuple(ctx.nodes), outputs), feeds


def _values(result: Any) -> list[Any]:
    if result is None:
        return []
    return list(result) if isinstance(result, list | tuple) else [result]


def check_round_trip(graph: Graph) -> None:
    data = serialize.dumps(graph)
    again = serialize.loads(data)
    assert again == graph, "the graph changed through its JSON"
    assert serialize.dumps(again) == data, "the graph's JSON is not canonical"


def check_lowering(op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                   tol: Tolerance | None = None, values: bool = True) -> Graph:
    """Lower op on these arguments, run the graph, compare with eager; `values=False` compares
    shapes and dtypes only (for ops whose output is uninitialized memory)."""
    graph, feeds = lower_op(op, args, kwargs)
    verify(graph)
    check_round_trip(graph)
    before = {name: tensor.clone() for name, tensor in feeds.items()}
    got = run_graph(graph, feeds)
    for name, tensor in feeds.items():
        torch.testing.assert_close(tensor, before[name], rtol=0, atol=0, equal_nan=True,
                                   msg=f"the graph wrote to its input {name}")
    want = flat_outputs(op(*args, **kwargs))
    assert len(got) == len(want), f"{len(got)} outputs, eager gives {len(want)}"
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert (g.shape, g.dtype) == (w.shape, w.dtype), (
            f"output {k}: {g.dtype}{list(g.shape)}, eager gives {w.dtype}{list(w.shape)}")
        if values:
            assert_matches(g, w, tol, f"output {k}")
    return graph


def assert_matches(got: torch.Tensor, want: torch.Tensor, tol: Tolerance | None, what: str) -> None:
    if want.dtype.is_floating_point:
        rtol, atol = tol or TOLERANCES[want.dtype]
    else:
        rtol, atol = 0.0, 0.0  # integers and bools: exact
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True,
                               msg=lambda m: f"{what}: {m}")


# -- inputs ----------------------------------------------------------------------------------
# Cases hold specs, not tensors: a spec is made when its case runs, from a seeded generator.

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64,
          "i64": torch.int64, "i32": torch.int32, "u8": torch.uint8, "b8": torch.bool}


@dataclass(frozen=True)
class T:
    """A tensor input: shape, dtype, fill, layout ("" contiguous, "t" transposed, "s" every
    other element of a wider tensor, "e" one row expanded: stride 0 along dim 0)."""

    shape: tuple[int, ...]
    dtype: str = "f32"
    fill: str = "randn"
    layout: str = ""

    def make(self, g: torch.Generator) -> torch.Tensor:
        if self.layout == "t":
            base = (*self.shape[:-2], self.shape[-1], self.shape[-2])
            return _fill(self.fill, base, DTYPES[self.dtype], g).transpose(-1, -2)
        if self.layout == "e":
            return _fill(self.fill, (1, *self.shape[1:]), DTYPES[self.dtype], g).expand(self.shape)
        if self.layout == "s":
            wide = (*self.shape[:-1], 2 * self.shape[-1])
            return _fill(self.fill, wide, DTYPES[self.dtype], g)[..., ::2]
        return _fill(self.fill, self.shape, DTYPES[self.dtype], g)


def t(*shape: int, dt: str = "f32", fill: str = "randn", lay: str = "") -> T:
    return T(shape, dt, fill, lay)


def b8(*shape: int, lay: str = "") -> T:
    return T(shape, "b8", "bool", lay)


def ints(*shape: int, lay: str = "") -> T:
    """int64 in [-5, 5]."""
    return T(shape, "i64", "ints", lay)


def idx(n: int, *shape: int, dt: str = "i64") -> T:
    """Indices in [0, n)."""
    return T(shape, dt, f"idx:{n}")


def neg(n: int, *shape: int) -> T:
    """Indices in [-n, n)."""
    return T(shape, "i64", f"neg:{n}")


def uniq(n: int, *shape: int) -> T:
    """Distinct indices in [0, n)."""
    return T(shape, "i64", f"uniq:{n}")


def perm(n: int, *shape: int, lay: str = "") -> T:
    """Indices in [0, n), distinct along dim 0 (along dim 1 when transposed)."""
    return T(shape, "i64", f"perm:{n}", lay)


def _fill(fill: str, shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    kind, _, arg = fill.partition(":")
    n = int(arg) if arg else 0
    if kind == "bool":
        return torch.rand(shape, generator=g) < 0.5
    if kind in ("idx", "neg", "perm", "uniq"):
        return _index_fill(kind, n, shape, g).to(dtype)
    if kind == "ints":  # small integers, so comparisons tie and divisions are exact
        return torch.randint(-5, 6, shape, generator=g).to(dtype)
    if kind == "nz":  # nonzero integers, for divisors
        values = torch.randint(1, 6, shape, generator=g)
        return torch.where(torch.rand(shape, generator=g) < 0.5, -values, values).to(dtype)
    if kind == "halves":
        return (torch.randint(-8, 9, shape, generator=g) / 2).to(dtype)
    if kind == "sorted":  # halves sorted along the last dim: boundaries, with ties
        return (torch.randint(-8, 9, shape, generator=g) / 2).sort(dim=-1).values.to(dtype)
    if kind == "tenths":  # 0.1 and its multiples, which fp16 and bf16 round
        return (torch.randint(-10, 11, shape, generator=g) / 10).to(dtype)
    if kind == "special":
        x = torch.randn(shape, generator=g)
        pick = torch.rand(shape, generator=g)
        x = torch.where(pick < 0.1, math.nan, torch.where(pick < 0.2, math.inf, x))
        return torch.where(pick > 0.9, -math.inf, x).to(dtype)
    if kind in _UNIFORM:
        lo, hi = _UNIFORM[kind]
        return (lo + (hi - lo) * torch.rand(shape, generator=g)).to(dtype)
    assert kind == "randn", f"unknown fill {fill!r}"
    return torch.randn(shape, generator=g).to(dtype)


_UNIFORM = {"pos": (0.1, 3.0), "unit": (-0.9, 0.9), "ge1": (1.0, 4.0), "near1": (0.8, 1.2)}


def _index_fill(kind: str, n: int, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """idx:n in [0, n); neg:n in [-n, n); perm:n distinct along dim 0; uniq:n distinct overall."""
    if kind == "idx":
        return torch.randint(0, n, shape, generator=g)
    if kind == "neg":
        return torch.randint(-n, n, shape, generator=g)
    if kind == "perm":
        return torch.rand((n, *shape[1:]), generator=g).argsort(dim=0)[:shape[0]]
    numel = math.prod(shape)
    return torch.randperm(n, generator=g)[:numel].reshape(shape)


def materialize(value: Any, g: torch.Generator) -> Any:
    if isinstance(value, T):
        return value.make(g)
    if isinstance(value, list | tuple):
        return type(value)(materialize(v, g) for v in value)
    if isinstance(value, dict):
        return {k: materialize(v, g) for k, v in value.items()}
    return value
