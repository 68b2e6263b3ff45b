"""Scheduling: kernel counts on canonical patterns, refusal reasons, buffer plans, golden dumps."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tasks.schedule.passes import Run
from tasks.schedule.verify import arena_overlaps
from tests.schedule_harness import compile_fn

GOLDEN = Path(__file__).parent / "golden" / "schedule"

torch.manual_seed(0)
X = torch.randn(8, 33)
W = torch.randn(33, 17)
B = torch.randn(17)


def test_layer_norm_is_one_kernel() -> None:
    c = compile_fn(lambda x: F.layer_norm(x, (33,)), X)
    assert c.kernels == 1


def test_layer_norm_with_residual_and_affine_is_one_kernel() -> None:
    w, b = torch.randn(33), torch.randn(33)
    c = compile_fn(lambda x, y: F.layer_norm(x + y, (33,), w, b), X, X.flip(0))
    assert c.kernels == 1


def test_softmax_is_one_kernel() -> None:
    assert compile_fn(lambda x: torch.softmax(x, -1), X).kernels == 1
    assert compile_fn(lambda x: torch.log_softmax(x * 0.5, -1), X).kernels == 1


def test_bias_add_and_gelu_after_a_matmul_is_one_kernel() -> None:
    c = compile_fn(lambda x: F.gelu(x @ W + B), X)
    assert (c.kernels, c.calls) == (1, 1)
    c = compile_fn(lambda x: F.gelu(F.linear(x, W.t(), B), approximate="tanh"), X)
    assert (c.kernels, c.calls) == (1, 1)


def test_a_bias_nothing_would_fuse_stays_in_the_matmul_call() -> None:
    """addmm's bias becomes a kernel's add only where a kernel of kiln's reads the product; read
    only by externs (attention, a matmul, through views) or returned, cuBLAS adds it."""
    c = compile_fn(lambda x: F.linear(x, W.t(), B), X)
    assert (c.kernels, c.calls) == (0, 1)
    c = compile_fn(lambda x: (F.linear(x, W.t(), B).reshape(8, 17, 1) * torch.ones(1, 1, 3)).sum(-1), X)
    assert c.kernels == 1  # the mul and the sum take the bias add
    c = compile_fn(lambda x: F.linear(x, W.t(), B).t().reshape(17, 8) @ X, X)
    assert (c.kernels, c.calls) == (0, 2)


def test_a_merge_of_contiguous_dims_reaches_a_matmul_as_a_view_not_a_copy() -> None:
    """A layer's [batch, seq, hidden] output reshaped to [batch * seq, hidden] for the next
    linear is a stride of its buffer: the matmuls read it in place (bert's query, key and value
    projections each copied it first)."""
    x = torch.randn(2, 4, 17)

    def projections(h: torch.Tensor) -> torch.Tensor:
        h = F.layer_norm(h, (17,))  # a buffer of its own: the matmuls and the residual read it
        flat = h.reshape(8, 17)
        return (flat @ W.t()[:, :16] + flat @ W.t()[:, 16:32]).reshape(2, 4, 16) + h[..., :16]

    c = compile_fn(projections, x)
    assert c.calls == 2
    assert c.kernels == 2  # the layer norm, and the sum with the residual: no copy of h


def test_a_chain_of_ten_pointwise_ops_is_one_kernel() -> None:
    def chain(x: torch.Tensor) -> torch.Tensor:
        for i in range(10):
            x = torch.sin(x) * 1.5 + i if i % 2 else torch.relu(x - 0.1)
        return x

    assert compile_fn(chain, X).kernels == 1


def test_transpose_and_pointwise_is_one_kernel_without_a_copy() -> None:
    c = compile_fn(lambda x: x.t() * 2 + 1, X)
    assert c.kernels == 1
    assert "load in0[i1, i0]" in c.dumps["main/03-kernels.txt"]


def test_views_fold_into_loads() -> None:
    c = compile_fn(lambda x: (x.reshape(8, 3, 11).permute(2, 0, 1)[1:, :, ::2] * 3).sum(0), X)
    assert c.kernels == 1


def test_sibling_reductions_share_a_kernel() -> None:
    c = compile_fn(lambda x: (x.sum(-1), x.amax(-1), x.pow(2).mean(-1)), X)
    assert c.kernels == 1


def test_no_fusion_across_an_extern_call() -> None:
    c = compile_fn(lambda x: torch.relu(torch.relu(x) @ W), X)
    assert (c.kernels, c.calls) == (2, 1)
    assert "read by a call (extern)" in c.dumps["main/refused.txt"]


def test_a_reduction_over_a_leading_dim_keeps_its_epilogue_apart_and_says_why() -> None:
    square = torch.randn(9, 9)
    c = compile_fn(lambda x: x - x.amax(0, keepdim=True) * x.sum(-1, keepdim=True), square)
    assert c.kernels >= 2
    assert "not where the kernel computes it" in c.dumps["main/refused.txt"]


def test_graph_outputs_are_stored_even_when_also_consumed() -> None:
    c = compile_fn(lambda x: (torch.exp(x), torch.exp(x).sum(-1)), X)
    assert c.kernels == 1
    assert "a graph output" in c.dumps["main/refused.txt"]


def test_cat_and_pad_are_masked_loads_in_one_kernel() -> None:
    c = compile_fn(lambda x: F.pad(torch.cat([x, x * 2], 1), (1, 2, 0, 3), value=-1.0) + 1, X)
    assert c.kernels == 1
    assert "masked" in c.dumps["main/03-kernels.txt"]


def test_arena_reuses_memory_and_never_overlaps_live_buffers() -> None:
    def mlp(x: torch.Tensor) -> torch.Tensor:
        for _ in range(6):
            x = torch.tanh(x @ torch.ones(33, 33) / 33 + 1)
        return x

    c = compile_fn(mlp, X)
    main = c.schedule.main
    offsets = dict(main.arena)
    temps = sum(b.nbytes for b in main.buffers if b.name in offsets)
    assert main.arena_bytes < temps / 2
    assert arena_overlaps(main, Run(kernels=list(c.schedule.kernels))) == []


def test_identical_layers_share_kernel_keys() -> None:
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(33, 33)
            self.norm = torch.nn.LayerNorm(33)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.norm(x + F.gelu(self.fc(x)))
            return out

    model = torch.nn.Sequential(*(Block() for _ in range(3)))
    c = compile_fn(model, X)
    keys = [k.key for k in c.schedule.kernels]
    assert len(keys) == 3  # per layer: gelu, residual add and layer norm in one kernel
    assert len(set(keys)) == 1


def test_cond_and_while_bodies_are_scheduled_like_the_main_graph() -> None:
    from models.control import build_cond, build_while

    x = torch.randn(16, 32)
    for module in (build_cond(features=32), build_while(features=32, steps=4)):
        c = compile_fn(module.eval(), x)
        assert c.kernels >= 2
        assert any(".then/" in k or ".body/" in k for k in c.dumps)


# -- golden dumps: the IR before and after each pass ----------------------------------------

def _golden_cases() -> dict[str, tuple[object, tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    w, b = torch.randn(7), torch.randn(7)
    return {
        "softmax": (lambda x: torch.softmax(x, -1), (torch.randn(4, 7),)),
        "layer_norm_residual": (lambda x, y: F.layer_norm(x + y, (7,), w, b),
                                (torch.randn(4, 7), torch.randn(4, 7))),
        "matmul_bias_gelu": (lambda x: F.gelu(x @ torch.ones(7, 5) + 1), (torch.randn(4, 7),)),
        "transpose_cat": (lambda x: torch.cat([x.t(), x.t() * 2]).exp(), (torch.randn(4, 7),)),
    }


@pytest.mark.parametrize("case", sorted(_golden_cases()))
@pytest.mark.parametrize("dump", ["00-lowered", "01-dead-code", "02-inline", "03-kernels", "refused"])
def test_golden_pass_dumps(case: str, dump: str) -> None:
    fn, inputs = _golden_cases()[case]
    c = compile_fn(fn, *inputs)  # type: ignore[arg-type]
    text = c.dumps[f"main/{dump}.txt"]
    path = GOLDEN / case / f"{dump}.txt"
    if os.environ.get("KILN_UPDATE_GOLDEN") or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if not os.environ.get("KILN_UPDATE_GOLDEN"):
            pytest.fail(f"wrote missing golden file {path}; rerun")
    assert text == path.read_text(), f"{path} differs; KILN_UPDATE_GOLDEN=1 rewrites it"


def test_a_residual_stream_is_stored_not_recomputed_by_every_later_layer() -> None:
    weights = [torch.randn(33, 33) / 6 for _ in range(6)]

    def residual(x: torch.Tensor) -> torch.Tensor:
        for w in weights:
            x = x + torch.tanh(F.layer_norm(x, (33,)) @ w)
        return x

    c = compile_fn(residual, X)
    widest = max(sum(p.role == "in" for p in k.params) for k in c.schedule.kernels)
    assert widest <= 5
    assert "buffers (more than 4)" in c.dumps["main/refused.txt"]
