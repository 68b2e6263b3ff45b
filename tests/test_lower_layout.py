"""Channels-last on the cuda target (tasks/lower/layout.py), checked on the CPU: the graph lowered
with lower.layout = "auto", run by the IR's interpreter and by the schedule, against eager."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tasks.ir.nodes import BufferKind, Extern, ExternOp, Pointwise, Reduction, channels_last_strides
from tasks.lower.context import LoweringError
from tests.schedule_harness import compile_fn


class Block(nn.Module):
    """A resnet's stem and basic block, with a head: convolutions without bias into batch norm
    and ReLU, a max pool, a residual add, a mean over the plane and a linear layer; and a
    transposed convolution and a 1-d one, which stay as traced."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 6, 3, padding=1, bias=False)
        self.norm = nn.BatchNorm2d(6)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.conv1 = nn.Conv2d(6, 6, 3, padding=1, bias=False)
        self.norm1 = nn.BatchNorm2d(6)
        self.conv2 = nn.Conv2d(6, 6, 3, padding=1)
        self.up = nn.ConvTranspose2d(6, 4, 2, stride=2)
        self.line = nn.Conv1d(4, 4, 3)
        self.head = nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.pool(torch.relu(self.norm(self.stem(x))))
        z = torch.relu(self.conv2(torch.relu(self.norm1(self.conv1(y)))) + y)
        up = self.up(z)
        return self.head(z.mean((2, 3))), up, self.line(up.flatten(2)[:, :, :9]), z


def _block() -> nn.Module:
    torch.manual_seed(0)
    model = Block().eval()
    with torch.no_grad():
        for norm in (model.norm, model.norm1):
            norm.running_mean.uniform_(-0.5, 0.5)  # type: ignore[union-attr]
            norm.running_var.uniform_(0.5, 1.5)  # type: ignore[union-attr]
    return model


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_conv_block_laid_out_channels_last_matches_eager(dtype: torch.dtype) -> None:
    model = _block().to(dtype)
    x = torch.randn(2, 3, 16, 16, dtype=dtype)
    compiled = compile_fn(model, x, rtol=2e-2, atol=2e-2, layout="auto")
    graph = compiled.graph
    weights = {b.weight: b for b in graph.inputs if b.kind is BufferKind.WEIGHT}
    for name in ("stem.weight", "conv1.weight", "conv2.weight"):
        assert weights[name].stride == channels_last_strides(weights[name].shape), name
    assert weights["up.weight"].stride == (16, 4, 2, 1)  # a transposed convolution's: as traced
    convs = [n for n in graph.nodes if isinstance(n, Extern) and n.op is ExternOp.CONVOLUTION]
    laid = [n.out.stride == channels_last_strides(n.out.shape) for n in convs if len(n.out.shape) == 4]
    assert laid == [True, True, True, False]  # stem, conv1, conv2; not the transposed one
    # conv2's bias is a kernel's add after cuDNN's call, as eager adds it; the transposed and 1-d keep theirs
    assert [n.inputs[2] is None for n in convs] == [True, True, True, False, False]
    # the batch norms and ReLUs, the pool and the residual add write [N, H, W, C] buffers
    shapes = [n.outs[0].shape[1:] for n in graph.nodes if isinstance(n, Pointwise | Reduction)]
    assert shapes.count((16, 16, 6)) >= 1
    assert shapes.count((8, 8, 6)) >= 3
    assert (6, 16, 16) not in shapes
    assert shapes.count((6, 8, 8)) == 1
    assert graph.outputs[-1] == graph.nodes[-1].outs[0].name


class BiasedConvolutions(nn.Module):
    """A convolution with a bias into a ReLU, a depthwise one with a bias (eager's depthwise
    kernels add it inside), and a biased one whose output is the model's."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.last = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.conv(x))
        return self.last(y), torch.relu(self.depthwise(y))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_convolutions_bias_is_added_after_it_where_eager_adds_it(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = BiasedConvolutions().eval().to(dtype)
    graph = compile_fn(model, torch.randn(2, 4, 8, 8, dtype=dtype), rtol=2e-2, atol=2e-2, layout="auto").graph
    convs = [n for n in graph.nodes if isinstance(n, Extern) and n.op is ExternOp.CONVOLUTION]
    assert [n.inputs[2] is None for n in convs] == [True, True, False]  # conv, last, depthwise
    names = {b.name for n in graph.nodes for b in n.outs}
    assert all(name in names for name in graph.outputs)


def test_the_traced_layout_and_the_cpu_target_keep_row_major() -> None:
    model = _block().to(torch.float16)
    graph = compile_fn(model, torch.randn(2, 3, 16, 16, dtype=torch.float16), rtol=2e-2, atol=2e-2).graph
    assert all(b.stride == torch.empty(b.shape).stride() for b in graph.inputs)
    assert not any(isinstance(n, Extern) and n.out.stride != torch.empty(n.out.shape).stride()
                   for n in graph.nodes)


def test_float32_convolutions_stay_as_traced() -> None:
    graph = compile_fn(_block(), torch.randn(2, 3, 16, 16), layout="auto").graph
    assert all(b.stride == torch.empty(b.shape).stride() for b in graph.inputs)



class LoopOfConvolutions(nn.Module):
    """A while_loop whose body returns a convolution's channels-last output as the next carried
    value (the body's inputs are row-major)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch._higher_order_ops.while_loop import while_loop

        start = (torch.zeros((), dtype=torch.int64), x.clone())
        result: torch.Tensor = while_loop(  # type: ignore[no-untyped-call]
            lambda i, t: i < 2, lambda i, t: (i + 1, self.conv(t)), start)[1]
        return result


class ConvOutputs(nn.Module):
    """A convolution's output returned as it is, twice."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        return y, y


def test_outputs_and_loop_results_keep_eagers_layout() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 4, 8, 8, dtype=torch.float16)
    compile_fn(LoopOfConvolutions().to(torch.float16), x, rtol=2e-2, atol=2e-2, layout="auto")
    graph = compile_fn(ConvOutputs().to(torch.float16), x, rtol=2e-2, atol=2e-2, layout="auto").graph
    outs = {b.name: b for n in graph.nodes for b in n.outs}
    assert [outs[name].stride for name in graph.outputs] == [(384, 64, 8, 1)] * 2


def test_as_strided_over_a_relaid_weight_is_refused() -> None:
    class Strided(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(4, 6, 3, padding=1)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.conv(x), torch.as_strided(self.conv.weight, (6, 36), (36, 1)) * 2

    with pytest.raises(LoweringError, match="as_strided over p_conv_weight, which eager lays out"):
        compile_fn(Strided().to(torch.float16), torch.randn(2, 4, 8, 8, dtype=torch.float16), layout="auto")


class StridedOverKernels(nn.Module):
    """as_strided over a biased convolution's output and over a ReLU's, addressing the storage as
    eager lays it out for a channels-last input: channels-last, as kiln's [N, H, W, C] buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        return (torch.as_strided(y, (2, 6, 4, 4), (384, 1, 96, 12)),
                torch.as_strided(torch.relu(y), (2, 3, 8), (384, 2, 48)))


def test_as_strided_over_a_channels_last_kernel_matches_eager() -> None:
    # Note: before, both were refused: kiln took eager's layout for NCHW, not the trace's
    torch.manual_seed(0)
    x = torch.randn(2, 4, 8, 8, dtype=torch.float16).to(memory_format=torch.channels_last)
    compile_fn(StridedOverKernels().eval().half(), x, rtol=2e-2, atol=2e-2, layout="auto")
    with pytest.raises(LoweringError, match="as_strided over"):  # an NCHW input: eager's layout is NCHW
        compile_fn(StridedOverKernels().eval().half(), x.contiguous(), rtol=2e-2, atol=2e-2, layout="auto")


class PermutedConvolution(nn.Module):
    """A convolution's channels-last buffer, permuted so that its view's indices match an
    [N, H, W, C] kernel buffer's, and as_strided over it as eager lays it out (NCHW)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        return y.permute(0, 3, 1, 2) * 2, torch.as_strided(y, (2, 6, 4), (384, 64, 1))


def test_as_strided_over_a_convolutions_buffer_stays_refused_after_a_permute() -> None:
    # Note: a review caught this: the permute's view looked like a kernel's NHWC buffer, and the
    # refusal was lifted over storage that eager lays out NCHW
    x = torch.randn(2, 4, 8, 8, dtype=torch.float16)
    with pytest.raises(LoweringError, match="as_strided over"):
        compile_fn(PermutedConvolution().eval().half(), x, rtol=2e-2, atol=2e-2, layout="auto")
