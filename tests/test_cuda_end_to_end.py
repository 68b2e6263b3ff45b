"""kiln end to end on the GPU (gpu marker; needs CUDA): each reference model compiled for the
cuda target, loaded and run on the GPU, against eager on the GPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.config import load_config
from pipeline.build import Cache, compile_model
from pipeline.runner import BuildOptions

pytestmark = pytest.mark.gpu

MODELS = ("mlp", "bert", "gpt2", "resnet18", "convnet", "while", "nested")
NEEDS = {"bert": "transformers", "gpt2": "transformers", "resnet18": "torchvision"}


@pytest.fixture(scope="module")
def gpu_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cache]:
    cache = Cache.open(tmp_path_factory.mktemp("cuda-e2e") / "cache")
    yield cache
    cache.records.close()


def _build(name: str, root: Path, cache: Cache) -> Path:
    if name in NEEDS:
        pytest.importorskip(NEEDS[name])
    out = root / name
    compile_model(load_config(name), BuildOptions("cuda", out), cache)
    return out


def _assert_matches(got: object, want: object) -> None:
    import torch

    from kiln.run_model import flat_tensors

    for a, b in zip(flat_tensors(got), flat_tensors(want), strict=True):
        assert a.is_cuda
        half = a.dtype in (torch.float16, torch.bfloat16)
        tol = 1e-2 if half else 1e-4
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def _on_gpu(values: tuple[object, ...]) -> tuple[object, ...]:
    import torch

    return tuple(v.cuda() if isinstance(v, torch.Tensor) else v for v in values)


@pytest.mark.parametrize("name", MODELS)
def test_model_on_the_gpu_matches_eager(name: str, tmp_path: Path, gpu_cache: Cache) -> None:
    from kiln.loader import load
    from kiln.run_model import eager_model, random_inputs

    out = _build(name, tmp_path, gpu_cache)
    config = load_config(name)
    compiled, model = load(out), eager_model(config, out).cuda()
    for seed in (1, 2):
        inputs = _on_gpu(random_inputs(config, seed))
        _assert_matches(compiled(*inputs), model(*inputs))


@pytest.mark.parametrize("layout", ["auto", "traced"])
def test_resnet18_in_half_precision_in_each_layout_matches_eager(layout: str, tmp_path: Path,
                                                                 gpu_cache: Cache) -> None:
    """lower.layout = "auto" lays resnet18's convolutions out channels-last (tasks/lower/layout.py):
    its weights relaid at create, cuDNN's calls on channels-last views, the kernels between them
    walking [N, H, W, C] buffers; within fp16's tolerance of eager's NCHW calls, as "traced" is."""
    import dataclasses

    import torch

    from kiln.loader import load
    from kiln.run_model import eager_model, random_inputs

    pytest.importorskip("torchvision")
    config = load_config("resnet18")
    inputs = [{**spec, "dtype": "float16"} for spec in config.fields["inputs"]]
    config = dataclasses.replace(config, fields={**config.fields, "model.dtype": "float16", "inputs": inputs,
                                                 "lower.layout": layout})
    result = compile_model(config, BuildOptions("cuda", tmp_path / "b"), gpu_cache)
    wrapper = result.entries["gen-cpp"].file("wrapper.cpp").read_text()
    assert wrapper.count("kiln::cudnn_convolution(") == 20  # every convolution: none has a bias
    assert ("{576, 1, 192, 64}" in wrapper) is (layout == "auto")  # layer1's 3x3 weights, channels-last
    compiled, model = load(tmp_path / "b"), eager_model(config, tmp_path / "b").cuda()
    with torch.no_grad():
        for seed in (1, 2):
            fresh = _on_gpu(random_inputs(config, seed))
            want = model(*fresh).float()
            for _ in range(2):  # the second run replays
                got = compiled(*fresh)
                assert got.dtype == torch.float16
                assert got.stride() == want.stride()
                # other cuDNN algorithms round otherwise: the zoo's bound (scripts/zoo.py TOLERANCE)
                assert (got.float() - want).abs().max() <= 2e-2 * want.abs().max()


def test_cond_on_the_gpu_takes_both_branches(tmp_path: Path, gpu_cache: Cache) -> None:
    from kiln.loader import load
    from kiln.run_model import eager_model, random_inputs

    out = _build("cond", tmp_path, gpu_cache)
    config = load_config("cond")
    compiled, model = load(out), eager_model(config, out).cuda()
    (x,) = _on_gpu(random_inputs(config))
    outcomes = set()
    for scale in (100.0, -100.0):
        inputs = (x * scale,)  # type: ignore[operator]
        outcomes.add(bool(model.proj(*inputs).sum() > 0))
        _assert_matches(compiled(*inputs), model(*inputs))
    assert outcomes == {True, False}


def test_a_run_on_a_stream_of_the_callers(tmp_path: Path, gpu_cache: Cache) -> None:
    """A run inside `torch.cuda.stream(s)` queues its work on s (torch's current stream)."""
    import torch

    from kiln.loader import load
    from kiln.run_model import eager_model, random_inputs

    out = _build("mlp", tmp_path, gpu_cache)
    config = load_config("mlp")
    compiled, model = load(out), eager_model(config, out).cuda()
    inputs = _on_gpu(random_inputs(config))
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    with torch.cuda.stream(stream):
        got = compiled(*inputs)
    stream.synchronize()
    _assert_matches(got, model(*inputs))


def test_the_readme_cpp_example_runs_a_cuda_model(tmp_path: Path, gpu_cache: Cache) -> None:
    import subprocess

    import torch

    from contract.config import PROJECT_ROOT
    from kiln.loader import load
    from tasks.codegen.cpp_build import torch_include, torch_lib

    out = _build("mlp", tmp_path, gpu_cache)
    exe = tmp_path / "run_model"
    source = PROJECT_ROOT / "examples" / "cpp" / "run_model.cpp"
    subprocess.run(["g++", "-std=c++17", "-O1", str(source), f"-I{out}", f"-I{torch_include()}",
                    f"-L{out}", "-l:model.so", f"-L{torch_lib()}", "-Wl,--no-as-needed", "-ltorch_cuda",
                    "-Wl,--as-needed", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{torch_lib()}",
                    f"-Wl,-rpath,{out}", "-o", str(exe)], check=True)
    ran = subprocess.run([str(exe), str(out)], capture_output=True, text=True, check=True)
    x = ((torch.arange(32 * 64) % 100).float().reshape(32, 64) * 0.01).cuda()
    want = load(out)(x).cpu()
    assert float(ran.stdout.split("sum")[1]) == pytest.approx(float(want.double().sum()), rel=1e-4)


def _half_convolutions() -> object:
    import torch
    from torch import nn

    class Convolutions(nn.Module):
        """Each kind of convolution the cuda wrapper tells apart (tasks/gen_cpp/wrapper.py: on_cudnn):
        cuDNN's into a batch norm and ReLU, and feeding another, and 3-d; at::convolution's
        depthwise one, and one with a bias whose product is an output."""

        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(3, 16, 3, padding=1, bias=False)
            self.norm = nn.BatchNorm2d(16)
            self.plain = nn.Conv2d(16, 16, 1, bias=False)
            self.depthwise = nn.Conv2d(16, 32, 3, padding=1, groups=16)
            self.head = nn.Conv2d(32, 8, 3, stride=2, dilation=2)
            self.volume = nn.Conv3d(2, 4, 3, padding=1, bias=False)

        def forward(self, x: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = torch.relu(self.norm(self.stem(x)))
            y = self.depthwise(self.plain(y)) + 1
            return self.head(y), self.volume(v)

    torch.manual_seed(0)
    model = Convolutions().eval()
    with torch.no_grad():
        model.norm.running_mean.uniform_(-0.5, 0.5)  # type: ignore[union-attr]
        model.norm.running_var.uniform_(0.5, 1.5)  # type: ignore[union-attr]
    return model


@pytest.mark.parametrize("layout", ["traced", "auto"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_convolutions_through_cudnn_match_eager(dtype: str, layout: str, tmp_path: Path) -> None:
    import torch

    import kiln

    half = getattr(torch, dtype)
    model: torch.nn.Module = _half_convolutions().to("cuda", half)  # type: ignore[attr-defined]
    inputs = (torch.randn(4, 3, 20, 20, device="cuda", dtype=half),
              torch.randn(2, 2, 6, 6, 6, device="cuda", dtype=half))
    compiled = kiln.compile(model, inputs, target="cuda", out=tmp_path / "b", cache_dir=tmp_path / "c",
                            **{"lower.layout": layout})
    (wrapper,) = (tmp_path / "c").rglob("gen-cpp/*/wrapper.cpp")  # the one model's
    # stem, plain, volume; channels-last, the head too: its bias is added after it (externs._convolution)
    assert wrapper.read_text().count("kiln::cudnn_convolution(") == (4 if layout == "auto" else 3)
    # channels-last runs other cuDNN algorithms than eager's NCHW calls: the zoo's fp16 bound
    matches_on_fresh_inputs(compiled, model, inputs, relative=layout == "auto")


def matches_on_fresh_inputs(compiled: Any, model: Any, inputs: tuple[Any, ...],
                            relative: bool = False) -> None:
    """The compiled model against eager on two draws of inputs like `inputs`, each run twice (the
    second run replays its CUDA graphs); `relative`: within 2e-2 of eager's largest |output|
    (scripts/zoo.py's fp16 bound) instead of elementwise."""
    import torch

    from kiln.run_model import flat_tensors

    with torch.no_grad():
        for seed in (1, 2):
            torch.manual_seed(seed)
            fresh = tuple(torch.randn_like(t) for t in inputs)
            for _ in range(2):
                got, want = compiled(*fresh), model(*fresh)
                if not relative:
                    _assert_matches(got, want)
                    continue
                for a, b in zip(flat_tensors(got), flat_tensors(want), strict=True):
                    assert (a.float() - b.float()).abs().max() <= 2e-2 * b.float().abs().max()


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_attention_that_torchs_kernels_refuse_runs_as_eager_on_the_gpu(dtype: str, tmp_path: Path) -> None:
    """On the GPU too, kiln calls the memory-efficient kernel only where it takes the call (and a
    head size of 12 halves is not whole 16-byte vectors): the rest as eager runs it."""
    import torch

    import kiln
    from tests.test_compile_api import Attentions, AttentionsEagerChecks

    kind = getattr(torch, dtype)

    def draw(*shape: int) -> Any:
        return torch.randn(*shape, device="cuda", dtype=kind)

    def checks(e: int) -> tuple[Any, ...]:
        return draw(2, 4, 8, e), draw(2, 4, 8, e), draw(2, 4, 8, 2 * e), draw(2, 4, e, 8)

    cases: list[tuple[torch.nn.Module, tuple[Any, ...]]] = [
        (AttentionsEagerChecks(), checks(16)),
        (AttentionsEagerChecks(), checks(12)),
        (Attentions(), (draw(2, 8, 4), draw(2, 6, 4), draw(8, 6), torch.rand(2, 8, 6, device="cuda") > 0.3)),
    ]
    for index, (model, inputs) in enumerate(cases):
        compiled = kiln.compile(model, inputs, target="cuda", out=tmp_path / f"b{index}",
                                cache_dir=tmp_path / "c")
        with torch.no_grad():
            for _ in range(2):  # the second run replays
                _assert_matches(compiled(*inputs), model(*inputs))
