"""Generated Triton kernels against the schedule interpreter (TRITON_INTERPRET=1, on CPU), their
golden sources, and an sm_90 compile of every reference model's kernels (no GPU needed); on a GPU
(gpu marker), every variant and config compiled and run there against the interpreter too."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tasks.codegen.triton_kernel import (
    TritonVariant,
    configs,
    grid,
    kernel_name,
    signature,
    triton_source,
    triton_variants,
)
from tasks.schedule.model import Kernel
from tests.schedule_harness import compile_fn
from tests.triton_kernel_harness import (
    Job,
    check_interpreted,
    check_kernel,
    compile_sm90,
    jobs_for,
)

pytest.importorskip("triton")

torch.manual_seed(0)
X = torch.randn(8, 33)
B = torch.randn(33)
IDX = torch.randint(0, 8, (5, 3))
NAN_X = torch.where(X > 1, float("nan"), X)
WIDE = torch.randn(3, 5000)

PATTERNS: dict[str, tuple[Callable[..., Any], tuple[torch.Tensor, ...]]] = {
    "layer_norm": (lambda x: F.layer_norm(x * 2, (33,)), (X,)),
    "softmax": (lambda x: torch.softmax(x, -1), (X,)),
    "bias_gelu": (lambda x, b: F.gelu(x + b), (X, B)),
    "transpose_add": (lambda x, y: x.t() + y, (X, X.t().contiguous())),
    "permute_3d": (lambda x: x.permute(0, 2, 1) * 2 + 1, (torch.randn(3, 20, 17),)),
    # attention's keys, transposed per head: [B*S, H*D] -> [B*H, D, S], a contiguous read along d
    "heads_transpose": (lambda x, b: (x + b).view(2, 16, 4, 8).permute(0, 2, 3, 1).reshape(8, 8, 16),
                        (torch.randn(32, 32), torch.randn(32))),
    "argmax_nan": (lambda x: (x.argmax(-1), x.argmin(0), x.amax(-1)), (NAN_X,)),
    "welford_large_r": (lambda x: (x.var(1), x.mean(1)), (WIDE,)),
    "scatter_add": (lambda x, i: torch.zeros(8, 3).scatter_add(0, i, x[:5, :3]), (X, IDX)),
    "reductions": (lambda x: (x.argmax(-1), x.amax(0), x.sum(), x.var(1), (x > 0).all(1),
                              (x > 2).any(0), x.prod(1)), (X,)),
    "pad_cat": (lambda x: F.pad(torch.cat([x, x * 2], 1), (1, 2, 0, 3), value=-1.0) + 1, (X,)),
    "fp16_math": (lambda x: (x.half() * 3).sigmoid() + x.half(), (X,)),
    "bf16_norm": (lambda x: F.layer_norm(x.bfloat16(), (33,)), (X,)),
    "int_ops": (lambda a: (a // 3, a % 3, a * a - 7, a.abs(), (a & 1) == 1), (IDX - 4,)),
    # integer powers by square and multiply: wrapping past the type, negative exponents (ATen's powi)
    "int_pow": (lambda a, e: (torch.pow(a, e), torch.pow(a.int(), e.int() + 20), torch.pow(a, 5)),
                (torch.tensor([3, 7, 0, 2, -1, 1, -3, 5]), torch.tensor([39, 21, -1, -1, -3, -7, 5, 2]))),
    # shifts by a negative amount or by the width or more: 0 to the left, the sign's fill to the right
    # (numpy, the interpreter, defines them so; LLVM does not: the GPU run of the patterns checks)
    "shifts": (lambda a, s: (a << s, a >> s, a.int() << s.int(), a.int() >> s.int(),
                             a.to(torch.uint8) >> s.to(torch.uint8), a.to(torch.uint8) << s.to(torch.uint8)),
               (torch.tensor([3, -7, 1, -1, 5, -3, 9, -2]), torch.tensor([-1, 0, 3, 31, 32, 63, 64, 70]))),
    # the lowest integers by -1: a wrapping negation and 0, as torch's (LLVM leaves sdiv and srem undefined)
    "int_by_minus_one": (lambda a, d: (a // d, a % d, torch.fmod(a, d), a.int() // d.int(),
                                       a.int() % d.int()),
                         (torch.tensor([-2**63, -2**63 + 1, 5, -2**31, 7, 0]),
                          torch.tensor([-1, -1, -1, -1, 2, -1]))),
    # unsigned: no -1 to compare with (Triton refuses an unsigned tensor against a negative constant)
    "uint8_ops": (lambda a, d: (a // d, a % d, torch.fmod(a, d), torch.pow(a, d % 4)),
                  (torch.tensor([200, 7, 0, 255, 13, 1], dtype=torch.uint8),
                   torch.tensor([3, 2, 5, 255, 4, 1], dtype=torch.uint8))),
    "embedding": (lambda i, w: F.embedding(i, w) * 2, (IDX, X)),
    "gather_where": (lambda x, i: torch.where(x[:5, :3] > 0, x.gather(0, i), 0.5), (X, IDX)),
    "index_put": (lambda x, i: x.index_put((i[:, 0],), torch.ones(5, 33), accumulate=True), (X, IDX)),
    "math": (lambda x: (torch.tanh(x) + torch.expm1(x) * torch.log1p(x.abs()) + torch.atan2(x, x + 1)
                        + torch.round(x * 3) + torch.trunc(x * 3) + torch.erfinv(x.clamp(-0.9, 0.9))
                        + torch.sign(x) + torch.pow(x.abs(), 1.5) + torch.fmod(x, 0.7)
                        + torch.special.erfc(x) + torch.copysign(x, 0.5 - x)), (X,)),
    "scalar": (lambda x: x.sum() * x.mean(), (X,)),
    "zero_dim_reductions": (lambda s: (s.amax(), s.argmax(), s.mean(), (s > 0).any(), s.var()),
                            (torch.tensor(1.5),)),
    # the breadth lowerings: windows of three axes, pairwise distances, scans, searches, reductions
    # by index (masked reductions over the scattered elements), a prefix count
    "pools_3d": (lambda v: (*F.max_pool3d(v, 2, return_indices=True), F.avg_pool3d(v, 3, 2, 1),
                            F.adaptive_avg_pool3d(v, (2, 3, 2)), *F.adaptive_max_pool2d(v[0], (3, 4), True)),
                 (torch.randn(2, 3, 5, 6, 7),)),
    "cdist": (lambda a, b: (torch.cdist(a, b), torch.cdist(a, b, p=1.0), torch.cdist(a, b, p=float("inf"))),
              (torch.randn(2, 7, 5), torch.randn(2, 6, 5))),
    "scans_searches": (lambda x, s: (*torch.cummax(NAN_X, 1), torch.cummin(x, 0)[1], torch.cumsum(x, 1),
                                     torch.bucketize(x, s), torch.searchsorted(s, x, right=True)),
                       (X, torch.linspace(-2, 2, 9))),
    "by_index": (lambda x, i: (x[:5, :3].scatter_reduce(0, i, x[:5, :3] * 2, "amax"),
                               x[:5, :3].scatter_reduce(0, i, x[:5, :3], "prod", include_self=False),
                               x[:5, :3].scatter_reduce(0, i, x[:5, :3], "mean"),
                               x.index_reduce(0, i[:, 0], x[:5] * 3, "amin", include_self=False),
                               x.masked_scatter(x > 0, x.flip(0) * 2)), (X, IDX % 5)),
}
GOLDEN = Path(__file__).parent / "golden" / "triton"
CANONICAL = ["layer_norm", "softmax", "bias_gelu", "transpose_add"]


@cache
def _pattern_kernels(name: str) -> tuple[Kernel, ...]:
    fn, inputs = PATTERNS[name]
    return compile_fn(fn, *inputs).schedule.kernels


@cache
def _pattern_failures() -> dict[str, list[str]]:
    """Every pattern's kernels, every variant, two configs: one interpreting worker for all."""
    jobs: list[tuple[str, Job]] = [(name, j) for name in PATTERNS for k in _pattern_kernels(name)
                                   for j in jobs_for(k)]
    failures = check_interpreted([j for _, j in jobs])
    by_pattern: dict[str, list[str]] = {name: [] for name in PATTERNS}
    for f in failures:
        owner = next((n for n, j in jobs if f.startswith(f"{j.kernel.name} ") and
                      j.kernel in _pattern_kernels(n)), None)
        for n in ([owner] if owner else list(PATTERNS)):
            by_pattern[n].append(f)
    return by_pattern


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pattern_kernels_match_the_interpreter(name: str) -> None:
    failures = _pattern_failures()[name]
    assert not failures, "\n".join(failures)


def test_variants_and_configs_follow_the_kernel_kind() -> None:
    (pw,) = _pattern_kernels("bias_gelu")
    assert triton_variants(pw) == [TritonVariant("pointwise")]
    assert all(c["RBLOCK"] == 1 for c in configs(pw, TritonVariant("pointwise")))
    (ln,) = _pattern_kernels("layer_norm")
    assert [v.kind for v in triton_variants(ln)] == ["persistent", "looped"]
    persistent = configs(ln, TritonVariant("persistent"))
    assert all(c["RBLOCK"] == 64 for c in persistent)
    assert 2 <= len(persistent) <= 6
    config = {"XBLOCK": 4, "RBLOCK": 64, "num_warps": 4, "num_stages": 1}
    assert grid(ln, TritonVariant("persistent"), config) == (2, 1, 1)
    (tr,) = _pattern_kernels("transpose_add")  # out[33, 8] = in0[8, 33].t() + in1
    assert triton_variants(tr) == [TritonVariant("tiled", 1), TritonVariant("pointwise")]
    assert grid(tr, TritonVariant("tiled", 1), {**config, "XBLOCK": 16, "RBLOCK": 8}) == (3, 1, 1)
    (pm,) = _pattern_kernels("permute_3d")  # out[3, 17, 20] = in0[3, 20, 17].permute(0, 2, 1)
    assert triton_variants(pm)[0] == TritonVariant("tiled", 2)
    (heads,) = _pattern_kernels("heads_transpose")  # read along i1 (d) through (i0 % 4) * 8 + i1
    assert triton_variants(heads)[0] == TritonVariant("tiled", 2)
    wide = _pattern_kernels("welford_large_r")
    assert all(triton_variants(k) == [TritonVariant("looped")] for k in wide)
    assert signature(ln) == {"in0": "*fp32", "out0": "*fp32", "xnumel": "i32", "rnumel": "i32",
                             "XBLOCK": "constexpr", "RBLOCK": "constexpr"}
    half = list(_pattern_kernels("bf16_norm") + _pattern_kernels("fp16_math"))
    sigs = {t for k in half for t in signature(k).values()}
    assert {"*bf16", "*fp16"} <= sigs
    names = [kernel_name(k) for k in _pattern_kernels("reductions")]
    assert all(n.isidentifier() for n in names)
    assert len(set(names)) == len(names)


def test_every_variant_takes_the_same_arguments() -> None:
    for name in ("layer_norm", "softmax"):
        (k,) = _pattern_kernels(name)
        heads = {triton_source(k, v, "f").split("def f(")[1].split(")")[0] for v in triton_variants(k)}
        assert len(heads) == 1


@pytest.mark.parametrize("name", CANONICAL)
def test_golden_kernel_sources(name: str) -> None:
    fn, inputs = PATTERNS[name]
    again = compile_fn(fn, *inputs).schedule.kernels

    def text(kernels: tuple[Kernel, ...]) -> str:
        return "\n".join(triton_source(k, v, kernel_name(k)) for k in kernels for v in triton_variants(k))

    source = text(_pattern_kernels(name))
    assert source == text(again)
    path = GOLDEN / f"{name}.py.txt"
    if os.environ.get("KILN_UPDATE_GOLDEN") or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
        if not os.environ.get("KILN_UPDATE_GOLDEN"):
            pytest.fail(f"wrote missing golden file {path}; rerun")
    assert source == path.read_text(), f"{path} differs; KILN_UPDATE_GOLDEN=1 rewrites it"


REFERENCE_MODELS = ["mlp", "convnet", "cond", "while", "bert-small", "gpt2-small"]


@cache
def _model_kernels(name: str) -> tuple[Kernel, ...]:
    from contract.config import load_config
    from tasks.trace.factory import build_model, example_inputs

    if name.startswith(("bert", "gpt2")):
        pytest.importorskip("transformers")
    if name == "resnet18":
        pytest.importorskip("torchvision")
    config = load_config(name)
    model = build_model(config.fields, name, config.project_root)
    c = compile_fn(model, *example_inputs(config.field("inputs"), 0), rtol=1e-3, atol=1e-4)
    return tuple({k.key: k for k in c.schedule.kernels}.values())


@pytest.mark.parametrize("name", REFERENCE_MODELS)
def test_every_kernel_of_a_reference_model_matches_interpreted(name: str) -> None:
    jobs = [Job(j.kernel, j.variant, j.config, max(j.rtol, 1e-3), max(j.atol, 1e-4))
            for k in _model_kernels(name) for j in jobs_for(k)]
    failures = check_interpreted(jobs)
    assert not failures, "\n".join(failures)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["patterns", *REFERENCE_MODELS, "resnet18"])
def test_every_kernel_matches_the_interpreter_compiled_on_the_gpu(name: str) -> None:
    """What the interpreter checks above (each variant at two configs), compiled with the real
    libdevice and run on the GPU; tuning compares every other config with the default."""
    patterns = [k for p in PATTERNS for k in _pattern_kernels(p)]
    kernels = patterns if name == "patterns" else _model_kernels(name)
    failures = []
    for job in [j for k in kernels for j in jobs_for(k)]:
        try:
            check_kernel(job.kernel, job.variant, job.config, max(job.rtol, 1e-3), max(job.atol, 1e-4),
                         on_gpu=True)
        except Exception as err:
            failures.append(f"{job.kernel.name} {job.variant} {job.config}: {str(err)[-1500:]}")
    assert not failures, "\n".join(failures)


def test_integer_helpers_compile_for_sm90() -> None:
    """The integer helpers (powers, shifts, division by -1) through Triton's real compiler, which
    the interpreter above does not run: on a CPU machine too."""
    patterns = ("int_ops", "int_pow", "shifts", "int_by_minus_one", "uint8_ops")
    kernels = [k for p in patterns for k in _pattern_kernels(p)]
    results = compile_sm90(kernels)
    assert not [f"{r['name']}: {r['error']}" for r in results if "error" in r]
    assert len(results) == len(kernels)
    assert all(r["cubin_bytes"] > 0 for r in results)


@pytest.mark.parametrize("name", REFERENCE_MODELS)
def test_every_kernel_of_a_reference_model_compiles_for_sm90(name: str) -> None:
    kernels = _model_kernels(name)
    results = compile_sm90(list(kernels))
    errors = [f"{r['name']}: {r['error']}" for r in results if "error" in r]
    assert not errors, "\n".join(errors)
    assert len(results) == len(kernels)
    for r in results:
        assert r["cubin_bytes"] > 0, r
        assert r["shared"] >= 0, r
        assert r["num_warps"] >= 1, r


def test_unsupported_kernels_raise() -> None:
    (k,) = _pattern_kernels("bias_gelu")
    with pytest.raises(ValueError, match="no persistent variant"):
        triton_source(k, TritonVariant("persistent"), "f")
    with pytest.raises(ValueError, match="unknown Triton variant"):
        configs(k, TritonVariant("blocked"))
