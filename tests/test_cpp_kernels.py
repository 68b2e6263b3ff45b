"""Generated C++ kernels against the schedule interpreter, for every kernel of many patterns."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from contract.toolchain import FLAGS
from tasks.codegen.cpp_build import RUNTIME, compiler
from tasks.codegen.cpp_kernel import CpuVariant, kernel_source
from tests.cpp_kernel_harness import check_kernel, needs_cxx
from tests.schedule_harness import compile_fn

torch.manual_seed(0)
X = torch.randn(8, 33)
IDX = torch.randint(0, 8, (5, 3))

PATTERNS: dict[str, tuple[Callable[..., Any], tuple[torch.Tensor, ...]]] = {
    "softmax": (lambda x: torch.softmax(x, -1), (X,)),
    "layer_norm": (lambda x: F.layer_norm(x * 2, (33,)), (X,)),
    "pad_cat": (lambda x: F.pad(torch.cat([x, x * 2], 1), (1, 2, 0, 3), value=-1.0) + 1, (X,)),
    "transpose": (lambda x: x.t() * 2 + 1, (X,)),
    "reductions": (lambda x: (x.argmax(-1), x.amax(0), x.sum(), x.var(1), (x > 0).all(1)), (X,)),
    "argmin_2d": (lambda x: x.reshape(8, 3, 11).argmin(0), (X,)),
    "fp16_math": (lambda x: (x.half() * 3).sigmoid() + x.half(), (X,)),
    "bf16_norm": (lambda x: F.layer_norm(x.bfloat16(), (33,)), (X,)),
    "int_ops": (lambda a: (a // 3, a % 3, a * a - 7, a.abs(), (a & 1) == 1), (IDX - 4,)),
    "embedding": (lambda i, w: F.embedding(i, w) * 2, (IDX, X)),
    "gather_where": (lambda x, i: torch.where(x[:5, :3] > 0, x.gather(0, i), 0.5), (X, IDX)),
    "scatter_add": (lambda x, i: torch.zeros(8, 3).scatter_add(0, i, x[:5, :3]), (X, IDX)),
    "index_put": (lambda x, i: x.index_put((i[:, 0],), torch.ones(5, 33), accumulate=True), (X, IDX)),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh") - F.silu(x), (X,)),
    "nan_max": (lambda x: torch.where(x > 1, float("nan"), x).amax(-1), (X,)),
    "scalar": (lambda x: x.sum() * x.mean(), (X,)),
    "erfinv": (lambda x: torch.erfinv(x.clamp(-0.9, 0.9)) + torch.erfinv(x.sigmoid() * 2 - 1), (X,)),
    # A reduction over no dimension: one element, in a reduction loop of one iteration.
    "zero_dim_reductions": (lambda s: (s.amax(), s.argmax(), s.mean(), (s > 0).any(), s.var(),
                                       torch.logsumexp(s, 0), s.amin(0, keepdim=True)), (torch.tensor(1.5),)),
    "zero_size": (lambda e, x: (e.repeat(2, 1), torch.softmax(e, -1), e.sum(0) + x[0, :5], e.t() @ e),
                  (torch.randn(0, 5), X)),
}
VARIANTS = [CpuVariant(1, True), CpuVariant(0, False), CpuVariant(2, True), CpuVariant(1, True, split_r=True)]


@needs_cxx
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_generated_kernels_match_the_interpreter(name: str) -> None:
    fn, inputs = PATTERNS[name]
    c = compile_fn(fn, *inputs)
    for k in c.schedule.kernels:
        for variant in VARIANTS:
            half = any(p.spec.dtype.value in ("f16", "bf16") for p in k.params)
            check_kernel(k, variant, rtol=1e-2 if half else 1e-4, atol=1e-2 if half else 1e-5)


GOLDEN = Path(__file__).parent / "golden" / "cpp"
CANONICAL = ["softmax", "layer_norm", "pad_cat", "transpose", "embedding", "scatter_add"]


@pytest.mark.parametrize("name", CANONICAL)
def test_golden_kernel_sources(name: str) -> None:
    fn, inputs = PATTERNS[name]
    first = compile_fn(fn, *inputs)
    again = compile_fn(fn, *inputs)
    text = "\n".join(kernel_source(k, CpuVariant()) for k in first.schedule.kernels)
    assert text == "\n".join(kernel_source(k, CpuVariant()) for k in again.schedule.kernels)
    path = GOLDEN / f"{name}.cpp"
    if os.environ.get("KILN_UPDATE_GOLDEN") or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if not os.environ.get("KILN_UPDATE_GOLDEN"):
            pytest.fail(f"wrote missing golden file {path}; rerun")
    assert text == path.read_text(), f"{path} differs; KILN_UPDATE_GOLDEN=1 rewrites it"


@needs_cxx
def test_the_inner_loop_of_a_pointwise_kernel_is_vectorized(tmp_path: Path) -> None:
    c = compile_fn(lambda x, y: torch.relu(x * 2 + y), torch.randn(64, 256), torch.randn(64, 256))
    (k,) = c.schedule.kernels
    source = tmp_path / "k.cpp"
    source.write_text(kernel_source(k, CpuVariant()))
    out = str(tmp_path / "k.so")
    cmd = [compiler(), *FLAGS, f"-I{RUNTIME}", "-fopt-info-vec-optimized", str(source), "-o", out]
    report = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    assert "loop vectorized" in report


@needs_cxx
@pytest.mark.parametrize("name", ["mlp", "convnet", "cond", "while", "bert-small", "gpt2-small"])
def test_every_kernel_of_a_reference_model_compiles_and_matches(name: str) -> None:
    from contract.config import load_config
    from tasks.trace.factory import build_model, example_inputs

    if name.startswith(("bert", "gpt2")):
        pytest.importorskip("transformers")
    config = load_config(name)
    model = build_model(config.fields, name, config.project_root)
    c = compile_fn(model, *example_inputs(config.field("inputs"), 0), rtol=1e-3, atol=1e-4)
    distinct = {k.key: k for k in c.schedule.kernels}
    for k in distinct.values():
        check_kernel(k, CpuVariant(), rtol=1e-3, atol=1e-4)


def test_index_bounds_come_from_the_dimensions_an_integer_indexes() -> None:
    from tasks.codegen.inputs import index_bounds

    c = compile_fn(lambda i, w: F.embedding(i, w) * 2, IDX, torch.randn(30, 4))
    (k,) = c.schedule.kernels
    assert index_bounds(k) == {"in0": 30}
    c = compile_fn(lambda x, i: torch.zeros(8, 3).scatter_add(0, i, x[:5, :3]), X, IDX)
    scatter = next(k for k in c.schedule.kernels if any(p.role == "inout" for p in k.params))
    assert list(index_bounds(scatter).values()) == [8]


@needs_cxx
def test_reductions_and_math_functions_vectorize(tmp_path: Path) -> None:
    """Each pass of a layer norm and a softmax, and a tanh GELU, run as vector code: lanes of
    accumulators, and kiln's own exp / tanh / erf instead of scalar libm calls."""

    def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x, approximate="tanh")

    cases: list[tuple[Any, int]] = [
        (lambda x: torch.nn.functional.layer_norm(x, (256,)), 2),  # welford pass, normalize pass
        (lambda x: torch.softmax(x, -1), 3),  # max, sum of exp, divide
        (gelu_tanh, 1),
        (lambda x: torch.erf(x) * torch.sigmoid(x), 1),
    ]
    for fn, loops in cases:
        (k,) = compile_fn(fn, torch.randn(64, 256)).schedule.kernels
        source = tmp_path / "k.cpp"
        source.write_text(kernel_source(k, CpuVariant()))
        cmd = [compiler(), *FLAGS, f"-I{RUNTIME}", "-fopt-info-vec-optimized", str(source), "-o",
               str(tmp_path / "k.so")]
        report = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
        vectorized = {line.split(":")[1] for line in report.splitlines() if "loop vectorized" in line}
        assert len(vectorized) >= loops, report
