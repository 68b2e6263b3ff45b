"""Pooling and nearest upsampling lowerings, run through the IR interpreter against eager."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tasks.ir.expr import Op, walk
from tasks.ir.interpret import run_graph
from tasks.ir.nodes import Buffer, BufferKind, Fallback, Graph, Pointwise, ReduceOp, Reduction
from tasks.ir.verify import verify
from tasks.lower.context import Call, Lower
from tasks.lower.program import bind, dtype_of, out_meta, target_name
from tasks.lower.registry import LOWERINGS
from tasks.lower.values import TensorValue

aten: Any = torch.ops.aten
NAN, INF = float("nan"), float("inf")


def lower(op: Any, *args: Any, **kwargs: Any) -> tuple[Graph, dict[str, torch.Tensor]]:
    """The op's lowering as a graph of its own, with the tensors to feed it."""
    inputs: list[Buffer] = []
    feed: dict[str, torch.Tensor] = {}
    bound_args: list[Any] = []
    for k, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            buf = Buffer(f"x{k}", tuple(a.shape), tuple(a.stride()), dtype_of(a.dtype), "cpu",
                         BufferKind.INPUT)
            inputs.append(buf)
            feed[buf.name] = a
            bound_args.append(TensorValue.of(buf))
        else:
            bound_args.append(a)
    meta_args = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    meta = out_meta(op(*meta_args, **kwargs), "x")
    name = target_name(op)
    ctx = Lower("cpu")
    result = LOWERINGS[name](ctx, Call(name, "x", bind(op, tuple(bound_args), kwargs), meta))
    outs = result if isinstance(result, tuple) else (result,)
    names = []
    for value in outs:
        if not value.is_identity():
            value = ctx.copy(value, "out")
        names.append(value.buffer.name)
    graph = Graph(tuple(inputs), tuple(ctx.nodes), tuple(names))
    verify(graph)
    return graph, feed


def check(op: Any, *args: Any, exact: bool = False, **kwargs: Any) -> Graph:
    graph, feed = lower(op, *args, **kwargs)
    got = run_graph(graph, feed)
    want = op(*args, **kwargs)
    wants = list(want) if isinstance(want, tuple) else [want]
    assert len(got) == len(wants)
    for g, w in zip(got, wants, strict=True):
        assert g.dtype == w.dtype
        if exact:
            torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
        else:
            torch.testing.assert_close(g, w, equal_nan=True)
    return graph


def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)


def ops_of(graph: Graph) -> set[Op]:
    return {e.op for node in graph.nodes if isinstance(node, Pointwise | Reduction) for e in walk(node.body)}


# -- max pool --------------------------------------------------------------------------------

# (input shape, kernel, stride, padding, dilation, ceil_mode)
MAX_CASES = [
    ((2, 3, 7, 7), [3, 3], [2, 2], [1, 1], [1, 1], False),
    ((2, 3, 7, 7), [3, 3], [2, 2], [1, 1], [1, 1], True),
    ((1, 2, 8, 8), [2, 2], [], [0, 0], [1, 1], False),
    ((1, 1, 5, 5), [2, 2], [2, 2], [0, 0], [1, 1], True),
    ((2, 2, 7, 9), [3, 2], [2, 1], [1, 0], [2, 1], True),
    ((1, 2, 9, 8), [3, 3], [1, 1], [1, 1], [2, 2], False),
    ((1, 1, 6, 11), [3, 4], [3, 2], [1, 2], [1, 3], True),
    ((3, 10, 11), [3, 3], [3, 3], [1, 1], [2, 2], True),
    ((4, 7, 7), [3], [2], [1], [1], False),
]


@pytest.mark.parametrize(("shape", "kernel", "stride", "padding", "dilation", "ceil"), MAX_CASES)
def test_max_pool2d_with_indices(shape: tuple[int, ...], kernel: list[int], stride: list[int],
                                 padding: list[int], dilation: list[int], ceil: bool) -> None:
    check(aten.max_pool2d_with_indices.default, randn(*shape), kernel, stride, padding, dilation, ceil,
          exact=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.int64])
def test_max_pool2d_dtypes(dtype: torch.dtype) -> None:
    x = (randn(2, 3, 7, 7) * 50).to(dtype)
    check(aten.max_pool2d_with_indices.default, x, [3, 3], [2, 2], [1, 1], [1, 1], True, exact=True)


def test_max_pool2d_ties_take_the_first() -> None:
    x = torch.randint(-2, 2, (2, 2, 9, 9), generator=torch.Generator().manual_seed(1)).float()
    check(aten.max_pool2d_with_indices.default, x, [3, 3], [2, 2], [1, 1], [1, 1], True, exact=True)


def test_max_pool2d_nan_and_inf() -> None:
    x = randn(1, 2, 6, 6)
    x[0, 0, 0:2, 0:2] = NAN  # several NaNs in a window: torch points at the last
    x[0, 0, 3, 4] = NAN
    x[0, 1, :3, :3] = -INF  # a window of -inf: its first position inside the input
    x[0, 1, 4, 5] = INF
    check(aten.max_pool2d_with_indices.default, x, [3, 3], [2, 2], [1, 1], [1, 1], False, exact=True)
    check(aten.max_pool2d_with_indices.default, x, [3, 3], [2, 2], [1, 1], [2, 2], True, exact=True)


def test_max_pool2d_all_lowest_int() -> None:
    low = torch.iinfo(torch.int32).min
    x = torch.full((1, 1, 5, 5), low, dtype=torch.int32)
    x[0, 0, 4, 4] = 3
    check(aten.max_pool2d_with_indices.default, x, [3, 3], [2, 2], [1, 1], [2, 2], True, exact=True)


def test_max_pool2d_non_contiguous() -> None:
    channels_last = randn(2, 7, 9, 3).permute(0, 3, 1, 2)
    check(aten.max_pool2d_with_indices.default, channels_last, [3, 3], [2, 2], [1, 1], [1, 1], True,
          exact=True)
    sliced = randn(2, 3, 9, 14)[:, :, 1:8, ::2]
    check(aten.max_pool2d.default, sliced, [2, 3], [2, 2], [1, 1], [1, 1], True, exact=True)


@pytest.mark.parametrize("ceil", [False, True])
def test_max_pool2d(ceil: bool) -> None:
    graph = check(aten.max_pool2d.default, randn(2, 3, 7, 7), [3, 3], [2, 2], [1, 1], [1, 1], ceil,
                  exact=True)
    assert [type(n) for n in graph.nodes] == [Reduction]


def test_max_pool2d_without_padding_is_unmasked() -> None:
    graph = check(aten.max_pool2d.default, randn(1, 2, 8, 8), [2, 2], [2, 2], exact=True)
    assert Op.MASKED not in ops_of(graph)
    graph = check(aten.max_pool2d.default, randn(1, 2, 8, 8), [2, 2], [2, 2], [1, 1], exact=True)
    assert Op.MASKED in ops_of(graph)


def test_max_pool2d_with_indices_nodes() -> None:
    graph, _ = lower(aten.max_pool2d_with_indices.default, randn(1, 2, 7, 7), [3, 3], [2, 2], [1, 1])
    reductions = [n.op for n in graph.nodes if isinstance(n, Reduction)]
    assert reductions == [ReduceOp.MAX, ReduceOp.ARGMAX, ReduceOp.MAX]


# -- average pools ---------------------------------------------------------------------------

# (input shape, kernel, stride, padding, ceil_mode)
AVG_CASES = [
    ((2, 3, 7, 7), [3, 3], [2, 2], [1, 1], False),
    ((2, 3, 7, 7), [3, 3], [2, 2], [1, 1], True),
    ((1, 2, 8, 8), [2, 2], [], [0, 0], False),
    ((1, 1, 5, 5), [2, 2], [2, 2], [0, 0], True),
    ((1, 2, 6, 6), [4, 4], [3, 3], [2, 2], True),
    ((2, 2, 7, 10), [3, 2], [2, 3], [1, 1], True),
    ((3, 9, 8), [3, 3], [2, 2], [1, 0], True),
]


@pytest.mark.parametrize(("shape", "kernel", "stride", "padding", "ceil"), AVG_CASES)
@pytest.mark.parametrize("include_pad", [True, False])
def test_avg_pool2d(shape: tuple[int, ...], kernel: list[int], stride: list[int], padding: list[int],
                    ceil: bool, include_pad: bool) -> None:
    check(aten.avg_pool2d.default, randn(*shape), kernel, stride, padding, ceil, include_pad)


@pytest.mark.parametrize("ceil", [False, True])
def test_avg_pool2d_divisor_override(ceil: bool) -> None:
    check(aten.avg_pool2d.default, randn(2, 3, 7, 7), [3, 3], [2, 2], [1, 1], ceil, True, 5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_avg_pool2d_half(dtype: torch.dtype) -> None:
    x = randn(2, 3, 7, 9, dtype=dtype)
    check(aten.avg_pool2d.default, x, [3, 3], [2, 2], [1, 1], True, False)


def test_avg_pool2d_non_contiguous() -> None:
    x = randn(2, 7, 9, 3).permute(0, 3, 1, 2)
    check(aten.avg_pool2d.default, x, [3, 3], [2, 2], [1, 1], True, False)


def test_avg_pool2d_plain_divides_by_a_constant() -> None:
    graph = check(aten.avg_pool2d.default, randn(1, 2, 8, 8), [2, 2])
    assert not {Op.MASKED, Op.MINIMUM, Op.MAXIMUM} & ops_of(graph)


def test_avg_pool2d_integer_falls_back() -> None:
    x = torch.randint(-50, 50, (1, 2, 7, 7), generator=torch.Generator().manual_seed(2))
    check(aten.avg_pool2d.default, x, [3, 3], [2, 2], [1, 1], exact=True)


@pytest.mark.parametrize(("shape", "out"), [
    ((2, 3, 7, 7), [3, 3]),
    ((2, 3, 7, 9), [2, 4]),
    ((1, 2, 8, 8), [4, 2]),
    ((1, 2, 5, 5), [7, 7]),
    ((1, 2, 5, 6), [1, 1]),
    ((3, 10, 7), [4, 3]),
])
def test_adaptive_avg_pool2d(shape: tuple[int, ...], out: list[int]) -> None:
    check(aten._adaptive_avg_pool2d.default, randn(*shape), out)


def test_adaptive_avg_pool2d_divisible_is_a_plain_window() -> None:
    graph = check(aten._adaptive_avg_pool2d.default, randn(1, 2, 8, 12), [4, 3])
    assert not {Op.MASKED, Op.FLOORDIV} & ops_of(graph)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_adaptive_avg_pool2d_half(dtype: torch.dtype) -> None:
    check(aten._adaptive_avg_pool2d.default, randn(2, 3, 7, 9, dtype=dtype), [3, 4])


def test_adaptive_avg_pool2d_non_contiguous() -> None:
    check(aten._adaptive_avg_pool2d.default, randn(2, 9, 7, 3).permute(0, 3, 1, 2), [4, 3])


# -- nearest upsampling ----------------------------------------------------------------------

@pytest.mark.parametrize(("shape", "size", "scales"), [
    ((2, 3, 7, 7), [5, 9], None),
    ((2, 3, 7, 7), [14, 14], None),
    ((1, 2, 4, 5), [12, 15], None),
    ((1, 2, 9, 9), [3, 3], None),
    ((1, 2, 10, 10), [7, 13], None),
    ((1, 1, 14, 26), [46, 22], None),
    ((2, 3, 7, 7), None, [2.0, 2.0]),
    ((1, 2, 4, 6), None, [1.5, 0.5]),
    ((1, 2, 5, 5), None, [3.0, 1.7]),
    ((1, 1, 10, 10), None, [2.05, 0.3]),
])
def test_upsample_nearest2d_vec(shape: tuple[int, ...], size: list[int] | None,
                                scales: list[float] | None) -> None:
    check(aten.upsample_nearest2d.vec, randn(*shape), size, scales, exact=True)


@pytest.mark.parametrize(("size", "scales_h", "scales_w"), [([14, 21], None, None), ([20, 6], 2.9, None),
                                                          ([15, 11], 2.1, 1.6)])
def test_upsample_nearest2d_default(size: list[int], scales_h: float | None, scales_w: float | None) -> None:
    check(aten.upsample_nearest2d.default, randn(2, 3, 7, 7), size, scales_h, scales_w, exact=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.uint8])
def test_upsample_nearest2d_dtypes(dtype: torch.dtype) -> None:
    x = (randn(2, 3, 5, 7) * 40).to(dtype)
    check(aten.upsample_nearest2d.vec, x, [11, 9], None, exact=True)


def test_upsample_nearest2d_non_contiguous() -> None:
    x = randn(2, 5, 7, 3).permute(0, 3, 1, 2)
    check(aten.upsample_nearest2d.vec, x, None, [2.0, 3.0], exact=True)


def test_upsample_nearest2d_integer_ratio_is_integer_indexing() -> None:
    graph = check(aten.upsample_nearest2d.vec, randn(1, 2, 5, 7), None, [2.0, 3.0], exact=True)
    assert Op.FLOOR not in ops_of(graph)


def test_upsample_nearest2d_keeps_torch_fp32_rounding() -> None:
    # 14 -> 46: fp32 14/46 rounds low, so torch reads one row before floor(o * 14 / 46) at times
    graph = check(aten.upsample_nearest2d.vec, randn(1, 1, 14, 14), [46, 14], None, exact=True)
    assert Op.FLOOR in ops_of(graph)


# -- through export --------------------------------------------------------------------------

class Pools(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        f = torch.nn.functional
        return (f.max_pool2d(x, 3, 2, 1, ceil_mode=True), f.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
                f.adaptive_avg_pool2d(x, (3, 5)), f.interpolate(x, scale_factor=2.0, mode="nearest"),
                f.interpolate(x, size=(5, 9), mode="nearest"), f.max_pool2d(x[0], 2))


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_exported_module() -> None:
    from tasks.ir.oracle import program_data
    from tasks.lower.program import lower_program
    from tasks.trace.export import decomposition_table

    x = randn(2, 3, 7, 7)
    ep = torch.export.export(Pools(), (x,), strict=False).run_decompositions(decomposition_table())
    graph = lower_program(program_data(ep), {})
    verify(graph)
    assert not any(isinstance(n, Fallback) for n in graph.nodes)
    (name,) = [b.name for b in graph.inputs]
    for got, want in zip(run_graph(graph, {name: x}), Pools()(x), strict=True):
        torch.testing.assert_close(got, want)
