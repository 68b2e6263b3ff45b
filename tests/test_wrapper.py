"""gen-cpp's wrapper: goldens for canonical patterns, and the same bytes run to run."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tasks.gen_cpp.wrapper import wrapper_source
from tasks.targets.cpu.launch import CpuLauncher
from tasks.targets.cuda.launch import CudaLauncher
from tests.schedule_harness import compile_fn

GOLDEN = Path(__file__).parent / "golden" / "wrapper"


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.norm(F.gelu(self.fc(x)) + x)
        return out


class Conv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _cond(x: torch.Tensor) -> torch.Tensor:
    def centred(h: torch.Tensor) -> torch.Tensor:
        return h - h.mean(-1, keepdim=True)

    out: torch.Tensor = torch.cond(x.sum() > 0, lambda h: h.softmax(-1), centred, (x,))
    return out


def _while(x: torch.Tensor) -> torch.Tensor:
    def body(i: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return i + 1, h.t().contiguous() * 0.5 + h.flip(0)

    loop = torch._higher_order_ops.while_loop
    _, out = loop(lambda i, h: i < 3, body, (torch.tensor(0), x))  # type: ignore[no-untyped-call]
    result: torch.Tensor = out
    return result


CASES: dict[str, tuple[Callable[..., Any] | torch.nn.Module, tuple[torch.Tensor, ...]]] = {
    "linear_gelu_layernorm": (Block(), (torch.randn(8, 16),)),
    "conv_relu": (Conv(), (torch.randn(2, 3, 8, 8),)),
    "attention_bool_mask": (_attention, (*(torch.randn(1, 2, 8, 4) for _ in range(3)),
                                         torch.rand(1, 1, 8, 8) > 0.3)),
    "cond": (_cond, (torch.randn(4, 8),)),
    "while_transpose": (_while, (torch.randn(6, 6),)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_wrappers(name: str) -> None:
    fn, inputs = CASES[name]
    schedule = compile_fn(fn, *inputs).schedule
    text = wrapper_source(schedule, CpuLauncher())
    assert wrapper_source(schedule, CpuLauncher()) == text  # the same bytes run to run
    path = GOLDEN / f"{name}.cpp"
    if os.environ.get("KILN_UPDATE_GOLDEN") or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if not os.environ.get("KILN_UPDATE_GOLDEN"):
            pytest.fail(f"wrote missing golden file {path}; rerun")
    assert text == path.read_text(), f"{path} differs; KILN_UPDATE_GOLDEN=1 rewrites it"


def _default_decisions(schedule: Any) -> dict[str, Any]:
    """What an untuned autotune decides: each kernel's default variant and config."""
    from tasks.codegen.triton_kernel import configs, kernel_name, triton_variants

    decisions = {}
    for k in schedule.kernels:
        variant = triton_variants(k)[0]
        config = configs(k, variant)[0]
        facts = {"name": f"{kernel_name(k)}_{variant.kind}", "num_warps": config["num_warps"], "shared": 0}
        decisions[k.key] = {"variant": variant.kind, "function": facts["name"], "config": config,
                            "tuned": False, "cubin": "", "launch": facts}
    return decisions


@pytest.mark.parametrize("name", ["linear_gelu_layernorm", "cond", "while_transpose", "attention_bool_mask"])
def test_golden_cuda_wrappers(name: str) -> None:
    """The cuda wrapper: Triton launches (argument addresses, grid, kernel table), the rest as on
    the cpu target."""
    fn, inputs = CASES[name]
    schedule = compile_fn(fn, *inputs).schedule
    text = wrapper_source(schedule, CudaLauncher(_default_decisions(schedule)), "x86-64")
    assert "kiln::launch(ctx" in text or not schedule.kernels
    path = GOLDEN / f"{name}.cuda.cpp"
    if os.environ.get("KILN_UPDATE_GOLDEN") or not path.exists():
        path.write_text(text)
        if not os.environ.get("KILN_UPDATE_GOLDEN"):
            pytest.fail(f"wrote missing golden file {path}; rerun")
    assert text == path.read_text(), f"{path} differs; KILN_UPDATE_GOLDEN=1 rewrites it"


class Convolutions(torch.nn.Module):
    """A convolution of each kind the cuda wrapper tells apart (wrapper.on_cudnn)."""

    def __init__(self) -> None:
        super().__init__()
        self.plain = torch.nn.Conv2d(4, 8, 3, padding=1, bias=False)  # cuDNN's
        self.biased = torch.nn.Conv2d(8, 8, 1)  # at::convolution adds the bias
        self.depthwise = torch.nn.Conv2d(8, 16, 3, groups=8, bias=False)  # torch's own kernel
        self.volume = torch.nn.Conv3d(2, 2, 3, bias=False)  # cuDNN's
        self.line = torch.nn.Conv1d(2, 2, 3, bias=False)  # eager makes it 2-d first
        self.weight = torch.nn.Parameter(torch.randn(4, 4, 3, 3))

    def forward(self, x: torch.Tensor, v: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        last = x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)  # channels-last: NHWC algorithms
        return (self.depthwise(torch.relu(self.biased(self.plain(x)))), self.volume(v), self.line(s),
                F.conv2d(x, self.weight, stride=[2], padding=[1]),  # one value for both dims, widened
                F.conv2d(last, self.weight))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_the_cuda_wrapper_calls_cudnn_for_a_convolution_eager_runs_there(dtype: torch.dtype) -> None:
    module = Convolutions().to(dtype)
    inputs = (torch.randn(2, 4, 8, 8), torch.randn(1, 2, 5, 5, 5), torch.randn(1, 2, 9))
    schedule = compile_fn(module, *(t.to(dtype) for t in inputs)).schedule
    cuda = wrapper_source(schedule, CudaLauncher(_default_decisions(schedule)), "x86-64")
    assert "kiln::cudnn_convolution(" not in wrapper_source(schedule, CpuLauncher())
    if dtype is torch.float32:  # cuDNN's TF32 choice is the caller's process's
        assert "kiln::cudnn_convolution(" not in cuda
        return
    assert cuda.count("kiln::cudnn_convolution(") == 3
    assert cuda.count("kiln::convolution(") == 4
    assert "kiln::cudnn_convolution(out, in0, in1, {1, 1}, {1, 1}, {1, 1}, 1, " in cuda
    assert "kiln::cudnn_convolution(out, in0, in1, {2, 2}, {1, 1}, {1, 1}, 1, " in cuda
