"""Cases a review found kiln getting wrong, each now right or a clear error."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tasks.ir.dtypes import DType
from tasks.ir.interpret import run_graph
from tasks.ir.nodes import Buffer, BufferKind, Fallback, Graph
from tasks.ir.oracle import export, program_data
from tasks.lower.context import Call, Lower, LoweringError, OutMeta
from tasks.lower.program import GraphLowering, bind, lower_program, target_name
from tasks.lower.registry import LOWERINGS, _zero_dim
from tasks.lower.values import TensorValue
from tasks.schedule.model import CallStep
from tests.lowering_harness import lower_op
from tests.schedule_harness import compile_fn


def test_float_floor_division_matches_python() -> None:
    x = torch.tensor([1.0, -1.0, 7.5, -0.0, 3.0, 1e-30])
    compile_fn(lambda a: (a // 0.1, torch.floor_divide(a, -0.3), torch.div(a, 0.7, rounding_mode="floor")), x)
    compile_fn(lambda a, b: a // b, x, torch.tensor([0.1, 0.0, -2.5, 1.0, -0.0, 3.0]))


def test_float_remainder_takes_the_divisors_sign() -> None:
    x = torch.tensor([1.0, -1.0, 7.5, -0.0, 3.0, -2.25])
    compile_fn(lambda a: (2.5 % a, torch.remainder(a, 0.7), a % a.flip(0), torch.remainder(a, -0.3)), x)


def test_diagonal_is_a_view_at_every_offset_and_pair_of_dims() -> None:
    x = torch.randn(3, 4, 5)
    compile_fn(lambda a: (a.diagonal(), a.diagonal(1), a.diagonal(-2, 0, 2), a.diagonal(7), torch.diag(a[0]),
                          a.diagonal(0, -1, -2) * 2), x)


def test_math_ops_torch_has_whole_lower_to_kiln_expressions() -> None:
    nan, inf = math.nan, math.inf
    a = torch.tensor([1.0, -1.0, nan, 0.0, -0.0, 3e30, -inf, 2.5])
    b = torch.tensor([nan, 2.0, 1.0, -0.0, 0.0, 4e30, 1.0, -3.0])
    compile_fn(lambda x, y: (torch.fmax(x, y), torch.fmin(x, y), torch.hypot(x, y), torch.angle(x),
                             torch.copysign(x, y), torch.copysign(x, -y), torch.special.erfc(x)), a, b)
    compile_fn(torch.special.erfc, torch.tensor([3.0, 4.0, 5.0, 9.0, -2.0, 0.0]))  # the tail, not 0
    compile_fn(torch.ldexp, torch.randn(6), torch.randint(-3, 4, (6,)))
    compile_fn(torch.fmax, torch.randint(-5, 5, (6,)), torch.randint(-5, 5, (6,)))


def test_writing_a_view_scatters_into_a_copy() -> None:
    x = torch.randn(5, 6, 4)
    compile_fn(lambda a, s: torch.slice_scatter(a, s, 1, 1, 6, 2), x, torch.randn(5, 3, 4))
    compile_fn(lambda a, s: torch.slice_scatter(a, s, 0, -3, None), x, torch.randn(3, 6, 4))
    compile_fn(lambda a, s: torch.slice_scatter(a, s, 1, 7, 9), x, torch.randn(5, 0, 4))
    compile_fn(lambda a, s: torch.select_scatter(a, s, 2, -1), x, torch.randn(5, 6))
    compile_fn(lambda a, s: torch.diagonal_scatter(a, s, 1, 0, 1), x, torch.randn(4, 5))
    compile_fn(lambda a, s: torch.diagonal_scatter(a, s, -2, 1, 2), x, torch.randn(5, 4))


def test_unfold_and_unbind_copy_are_views() -> None:
    x = torch.randn(5, 7, 4)
    compile_fn(lambda a: (a.unfold(1, 3, 2), a.unfold(0, 2, 1), a.unfold(2, 4, 1),
                          torch.ops.aten.unbind_copy(a, 1)[2] * 1), x)
    compile_fn(lambda a: a.unfold(0, 1, 1) * 2, torch.tensor(3.0))


def test_addmv_and_addbmm_are_one_matmul_and_a_pointwise() -> None:
    compile_fn(lambda s, m, v: (torch.addmv(s, m, v, beta=0.5, alpha=2), torch.addmv(s[:1], m, v),
                                torch.addmv(s, m, v, beta=0)),
               torch.randn(3), torch.randn(3, 4), torch.randn(4))
    compile_fn(lambda s, b1, b2: (torch.addbmm(s, b1, b2, beta=2, alpha=0.5), torch.addbmm(s[0], b1, b2)),
               torch.randn(3, 4), torch.randn(2, 3, 5), torch.randn(2, 5, 4))


def test_batch_norm_in_training_mode_uses_and_moves_the_batch_statistics() -> None:
    x = torch.randn(4, 3, 5, 5)
    rm, rv, w, b = torch.randn(3), torch.rand(3) + 0.5, torch.randn(3), torch.randn(3)

    def step(x: torch.Tensor, rm: torch.Tensor, rv: torch.Tensor, w: torch.Tensor,
             b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        rm, rv = rm.clone(), rv.clone()
        return F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.3), rm, rv

    compile_fn(step, x, rm, rv, w, b)
    compile_fn(lambda a: (F.instance_norm(a), F.batch_norm(a, None, None, training=True)), x)


def test_bilinear_upsampling_blends_four_neighbours_as_torch_does() -> None:
    x = torch.randn(2, 3, 5, 7)
    compile_fn(lambda a: (F.interpolate(a, scale_factor=2, mode="bilinear"),
                          F.interpolate(a, size=(9, 4), mode="bilinear"),
                          F.interpolate(a, size=(8, 13), mode="bilinear", align_corners=True),
                          F.interpolate(a, scale_factor=1.7, mode="bilinear"),
                          F.interpolate(a, size=(1, 1), mode="bilinear", align_corners=True)), x)


def test_scans_are_masked_reductions() -> None:
    x = torch.randn(3, 6, 5)
    compile_fn(lambda a: (a.cumsum(1), a.cumprod(-1), a.cumsum(0, dtype=torch.float64), (a > 0).cumsum(2),
                          torch.tensor(2.0).cumsum(0)), x)
    compile_fn(lambda m: (m.cumsum(-1) - 1) * m, torch.ones(2, 9, dtype=torch.long))  # OPT's positions


def test_logcumsumexp_shifts_each_prefix_by_its_max() -> None:
    x = torch.randn(3, 6, 5)
    x[0, 0, 0], x[2, 3, 1] = -math.inf, math.inf
    x[1, :, 2] = -math.inf
    compile_fn(lambda a: (torch.logcumsumexp(a, 1), torch.logcumsumexp(a * 30, -1)), x)


def test_a_requested_rounding_survives_fusion() -> None:
    compile_fn(lambda a: (a.to(torch.bfloat16).to(torch.float32) * 3).exp(), torch.randn(8, 8))
    compile_fn(lambda a: a.double().float().double() + 1e-12, torch.randn(8))


def test_any_over_an_empty_dim_list_reduces_nothing() -> None:
    x = torch.randn(4, 8)
    compile_fn(lambda a: torch.logical_and(torch.ops.aten.any.dims(a > 0, []), a < 0.5), x)


def test_a_flipped_operand_is_copied_before_a_library_call() -> None:
    a, b = torch.randn(6, 5), torch.randn(5, 3)
    c = compile_fn(lambda x, y: x.flip(0) @ y, a, b)
    assert c.kernels == 1
    compile_fn(lambda x: x.flip(1).cumsum(1), a)


def test_as_strided_over_a_transposed_layout_is_an_error_not_a_wrong_answer() -> None:
    program = export(lambda a: (a.t() + 1).as_strided((3, 4), (1, 3)), (torch.randn(4, 3),))
    with pytest.raises(LoweringError, match=r"as_strided over .* eager lays out with strides"):
        lower_program(program_data(program), {})


def test_a_crash_inside_a_lowering_names_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(ctx: Lower, call: Call) -> Any:
        raise KeyError("oops")

    monkeypatch.setitem(LOWERINGS, "aten.tanh.default", broken)
    program = export(lambda a: a.tanh() + 1, (torch.randn(3),))
    with pytest.raises(LoweringError, match=r"KeyError: 'oops'\n  while lowering aten.tanh.default"):
        lower_program(program_data(program), {})


def test_a_lowering_that_returns_the_wrong_shape_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(LOWERINGS, "aten.tanh.default", lambda ctx, call: call.tensor("self"))
    monkeypatch.setitem(LOWERINGS, "aten.sum.dim_IntList", lambda ctx, call: call.tensor("self"))
    program = export(lambda a: a.sum(0), (torch.randn(3, 2),))
    with pytest.raises(LoweringError, match=r"gave f32\[3, 2\] where torch has f32\[2\]"):
        lower_program(program_data(program), {})


def test_an_epilogue_after_a_matmul_says_why_it_is_not_fused() -> None:
    c = compile_fn(lambda a, b: torch.relu(a @ b + 1).sum(1), torch.randn(4, 5), torch.randn(5, 6))
    assert "it is a call (extern), and calls are never fused" in c.dumps["main/refused.txt"]


def test_attentions_that_read_one_boolean_mask_share_its_conversion() -> None:
    """One additive mask for every attention that reads the boolean mask: a conversion each
    made one kernel with an output per layer, so its key and tuning changed with the depth."""
    q = torch.randn(1, 2, 8, 4)
    mask = torch.rand(1, 1, 8, 8) > 0.3
    mask[..., 0] = True  # no row fully masked

    def layers(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = torch.nn.functional.scaled_dot_product_attention(x, x, x, attn_mask=m) + x
        return x

    compiled = compile_fn(layers, q, mask)
    masks = [k for k in compiled.schedule.kernels
             if any(o.startswith("scaled_dot_product_attention") for o in k.origins)]
    assert len(masks) == 1
    assert [p.role for p in masks[0].params] == ["in", "out"]


def test_batch_norm_saved_statistics_are_what_the_exported_kernel_returned() -> None:
    """CPU's eval batch norm returns empty statistics, CUDA's the running mean and
    1/sqrt(running var + eps): a model exported on a GPU carries (C,) metas, which every
    torchvision model with BatchNorm hit. Both forms lower, and the CUDA form's values are right."""
    op = torch.ops.aten._native_batch_norm_legit_no_training.default
    x, w, b, mean = torch.randn(2, 7, 3, 5), torch.randn(7), torch.randn(7), torch.randn(7)
    var = torch.rand(7) + 0.1
    graph, feeds = lower_op(op, (x, w, b, mean, var, 0.1, 1e-5), {})
    assert [tuple(t.shape) for t in run_graph(graph, feeds)] == [(2, 7, 3, 5), (0,), (0,)]

    ctx = Lower("cpu")
    bound = bind(op, (*(TensorValue.of(buffer) for buffer in graph.inputs), 0.1, 1e-5), {})
    f32 = graph.inputs[0].dtype
    cuda_metas = (OutMeta((2, 7, 3, 5), f32), OutMeta((7,), f32), OutMeta((7,), f32))
    result = LOWERINGS[target_name(op)](ctx, Call(target_name(op), "n", bound, cuda_metas))
    outputs = GraphLowering(ctx, lambda _node: "").finish_outputs(list(result))
    y, saved_mean, saved_rstd = run_graph(Graph(graph.inputs, tuple(ctx.nodes), outputs), feeds)
    torch.testing.assert_close(y, torch.nn.functional.batch_norm(x, mean, var, w, b, False, 0.1, 1e-5))
    torch.testing.assert_close(saved_mean, mean)
    torch.testing.assert_close(saved_rstd, torch.rsqrt(var + 1e-5))


_EMPTY = {
    "repeat": (lambda a: a.repeat(2, 1), (0, 3)),
    "pixel_shuffle": (lambda a: torch.nn.functional.pixel_shuffle(a, 2), (0, 4, 2, 2)),
    # (not pixel_unshuffle: eager's CPU kernel returns an empty input's shape unchanged, while
    # its export meta, which kiln follows, has the unshuffled one)
    "softmax": (lambda a: torch.softmax(a, -1), (0, 5)),
    "sum_keeping_an_empty_dim": (lambda a: a.sum(1) + 1, (0, 3)),
    "split": (lambda a: [t * 2 for t in a.split(1, 1)], (0, 3)),
}


@pytest.mark.parametrize("name", sorted(_EMPTY))
def test_an_op_whose_outputs_have_no_elements_lowers_to_empty_buffers(name: str) -> None:
    """Sizes of 0 reach lowerings that divide or take a modulo by them ("mod by 0" in repeat):
    a call with only empty outputs computes nothing and lowers to empty buffers."""
    fn, shape = _EMPTY[name]
    compile_fn(fn, torch.randn(shape))


@pytest.mark.parametrize("order", [2.0, 1.0, 0.0, 3.0, 0.5, -2.0, math.inf, -math.inf])
def test_vector_norms_and_dist_are_reductions(order: float) -> None:
    x = torch.randn(5, 4)
    x[0, 0] = 0.0
    x = x.abs() + 0.1 if order < 0 else x
    compile_fn(lambda a: torch.linalg.vector_norm(a, order), x)
    compile_fn(lambda a: torch.linalg.vector_norm(a, order, dim=(0,), keepdim=True), x)
    compile_fn(lambda a, b: torch.dist(a, b, order), x, x[0] * 2)


def test_a_scalar_argument_reaches_the_fallback_as_a_zero_dim_tensor() -> None:
    """torch's stable dispatcher passes no Scalar: the op's overload taking a tensor there is
    called instead (a polynomial's n_scalar -> default)."""
    x = torch.randn(5, 4)
    for fn in (lambda a: torch.ops.aten.special_hermite_polynomial_h.n_scalar(a, 3),
               lambda a: torch.ops.aten.special_chebyshev_polynomial_t.n_scalar(a, 2.0)):
        c = compile_fn(fn, x)
        (fallback,) = [n for n in c.graph.nodes if isinstance(n, Fallback)]
        assert fallback.target.endswith(".default"), fallback.target


@pytest.mark.parametrize("name", ["cholesky", "inv", "solve", "tensorinv"])
def test_an_effect_token_orders_a_kept_error_check(name: str) -> None:
    """torch threads linalg's error checks on effect tokens: no token reaches kiln's inputs or
    outputs, and the check (a fallback with no outputs) survives dead-code elimination."""
    a = torch.randn(4, 4)
    spd = a @ a.t() + torch.eye(4)
    fns = {"cholesky": torch.linalg.cholesky, "inv": torch.linalg.inv,
           "solve": lambda m: torch.linalg.solve(m, m[:, :2]),
           "tensorinv": lambda m: torch.linalg.tensorinv(m.reshape(4, 2, 2), ind=1)}
    c = compile_fn(fns[name], spd)
    assert len(c.graph.inputs) == 1
    checks = [n for n in c.graph.nodes if isinstance(n, Fallback) and not n.outs]
    assert checks, "the error check was dropped"
    calls = [s.node for s in c.schedule.main.steps if isinstance(s, CallStep)]
    assert any(isinstance(n, Fallback) and not n.outs for n in calls), "the schedule dropped the check"



def test_a_scalar_keeps_the_dtype_of_the_tensor_it_meets() -> None:
    """Found in review: an int Scalar as an int64 0-d tensor widened an int32 0-d tensor (a
    0-d tensor against a 0-d tensor promotes); now it takes the tensor's dtype when it fits."""
    cases = [(5, DType.I32, DType.I32), (2, DType.I16, DType.I16), (0.5, DType.F16, DType.F16),
             (70000, DType.F16, DType.I64), (1.5, DType.I32, DType.F32), (True, DType.F32, DType.F32)]
    for value, tensor_dtype, made_dtype in cases:
        t = TensorValue.of(Buffer("t", (), (), tensor_dtype, "cpu", BufferKind.INPUT))
        made = _zero_dim(Lower("cpu"), Call("aten.x.y", "n", {"self": t, "other": value}, None), value)
        assert made.dtype is made_dtype, (value, tensor_dtype)


def test_as_strided_over_attentions_result_addresses_eagers_layout() -> None:
    """attention's buffer takes eager's layout of its result (tasks/lower/externs.py:
    dense_layout), so an as_strided over it reads the storage as eager's does."""
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    compile_fn(lambda a, b, c: torch.as_strided(F.scaled_dot_product_attention(a, b, c), (2, 4), (1, 2)) + 1,
               q, k, v)
    heads = torch.randn(1, 8, 2, 4).transpose(1, 2)  # a transformer's query: the heads inside the tokens
    compile_fn(lambda a: torch.as_strided(F.scaled_dot_product_attention(a, a, a), (3, 4), (4, 1), 8) * 2,
               heads)


def test_alpha_zero_ignores_the_product_as_blas_does() -> None:
    """addmv and addbmm with alpha=0 (and beta=0) leave out the product, its infs and NaNs too,
    as torch's BLAS calls do; kiln's product times 0 was NaN there."""
    inf, nan = float("inf"), float("nan")

    def fn(b: torch.Tensor, m: torch.Tensor, v: torch.Tensor, c: torch.Tensor,
           x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.addmv(b, m, v, alpha=0.0), torch.addmv(b, m, v, alpha=0.0, beta=0.0),
                torch.addbmm(c, x, y, alpha=0.0), torch.addmv(b, m, v, alpha=2.0, beta=0.5))

    x = torch.randn(1, 3, 2)
    x[0, 0, 0] = inf
    compile_fn(fn, torch.randn(3), torch.tensor([[1, inf], [2, 3], [0, 1]]), torch.tensor([nan, 1.0]),
               torch.randn(3, 2), x, torch.randn(1, 2, 2))
