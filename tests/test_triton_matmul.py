"""The matmul template (tasks/codegen/triton_matmul.py): a schedule's matmul call and the kernel
that reads its product, as one Triton kernel, run under TRITON_INTERPRET=1 against eager, and
compiled for sm_90 (no GPU needed)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tasks.codegen.triton_matmul import (
    Matmul,
    matmul_configs,
    matmul_epilogue,
    matmul_grid,
    matmul_signature,
    matmul_source,
)
from tasks.ir.nodes import Extern
from tasks.schedule.model import CallStep, KernelStep, Schedule
from tests.schedule_harness import compile_fn
from tests.triton_source_worker import compile_sources, run_sources

pytest.importorskip("triton")


def pairs(schedule: Schedule) -> list[Matmul]:
    """The main graph's matmul calls the schedule marked with their epilogue kernel, as templates."""
    steps = schedule.main.steps
    found = []
    for i in schedule.main.epilogues:
        call, after = steps[i], steps[i + 1]
        assert isinstance(call, CallStep)
        assert isinstance(call.node, Extern)
        assert isinstance(after, KernelStep)
        m = matmul_epilogue(call.node, schedule.kernel(after.kernel))
        assert m is not None
        found.append(m)
    return found


def _h(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).half()


CASES: dict[str, tuple[Callable[..., Any], tuple[torch.Tensor, ...]]] = {
    # mm, then a bias (the float32 addmm rule makes F.linear mm + add) and ReLU; ragged tiles
    "f32_linear_relu": (lambda x, w, b: torch.relu(F.linear(x, w, b)),
                        (torch.randn(20, 24), torch.randn(40, 24), torch.randn(40))),
    # addmm in float16 (cuBLAS's epilogue adds the bias before rounding), then exact GELU
    "f16_addmm_gelu": (lambda x, w, b: F.gelu(torch.addmm(b, x, w.t())), (_h(18, 32), _h(48, 32), _h(48))),
    # addmm with alpha and beta, a 2-d self, a residual add after it
    "f16_addmm_scaled": (lambda s, x, w, r: torch.addmm(s, x, w, beta=0.5, alpha=2.0) + r,
                         (_h(17, 33), _h(17, 40), _h(40, 33), _h(17, 33))),
    # bmm over a transposed operand (a stride swap), scaled
    "f32_bmm_scale": (lambda q, k: torch.bmm(q, k.transpose(1, 2)) * 0.125,
                      (torch.randn(3, 19, 16), torch.randn(3, 21, 16))),
    # a linear layer on (batch, tokens, features): the product's rows are the epilogue's first two
    # loops; addmm's bias broadcast along the rows, a residual read at the epilogue's own index
    "f16_linear_3d_residual": (lambda x, w, b, r: F.linear(x, w, b) + r,
                               (_h(2, 9, 32), _h(40, 32), _h(40), _h(2, 9, 40))),
    # mm whose product its epilogue reads twice (x * sigmoid(x))
    "f16_mm_silu": (lambda a, b: F.silu(a @ b), (_h(16, 64), _h(64, 24))),
}
# Note: bfloat16 is compiled for sm_90 below, not interpreted: Triton 3.9's interpreter gives
# garbage for tl.dot of bfloat16 blocks (1e10 off for a 16x16 product of randn values).
COMPILED = {**CASES, "bf16_mm_silu": (lambda a, b: F.silu(a @ b),
                                      (torch.randn(16, 64).bfloat16(), torch.randn(64, 24).bfloat16()))}


def _job(m: Matmul, args: dict[str, torch.Tensor], config: dict[str, int]) -> dict[str, Any]:
    views = {"a": m.a, "b": m.b, "bias": m.bias}
    tensors: list[Any] = []
    for name in m.param_names():
        view = views.get(name)
        if view is not None:
            tensors.append(args[view.buffer].as_strided(view.shape, view.stride, view.offset))
            continue
        param = next(p for p in m.epilogue.params if p.name == name)
        if param.buffer not in args:  # an output
            args[param.buffer] = torch.empty_strided(param.spec.shape, param.spec.stride,
                                                     dtype=_torch_dtype(param.spec.dtype))
        tensors.append(args[param.buffer])
    constexprs = {k: v for k, v in config.items() if k not in ("num_warps", "num_stages")}
    return {"source": matmul_source(m, "mm_epilogue"), "name": "mm_epilogue", "grid": matmul_grid(m, config),
            "args": tensors, "constexprs": constexprs}


def _torch_dtype(dtype: Any) -> torch.dtype:
    from tasks.ir.interpret import torch_dtype

    return torch_dtype(dtype)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_matmul_and_its_epilogue_as_one_kernel_match_eager(name: str) -> None:
    fn, inputs = CASES[name]
    half = inputs[0].dtype != torch.float32
    compiled = compile_fn(fn, *inputs, rtol=2e-2 if half else 1e-4, atol=2e-2 if half else 1e-5)
    (m,) = pairs(compiled.schedule)
    args = {b.name: t for b, t in zip(compiled.graph.inputs, inputs, strict=True)}
    configs = matmul_configs(m)
    jobs = [_job(m, dict(args), c) for c in (configs[0], configs[-1])]
    with torch.no_grad():
        want = fn(*inputs)
    for got in run_sources(jobs):
        out = got[-1]  # the epilogue's one output: its last parameter here
        # float16: eager's own product is rounded as the template's is; a GELU may differ by a rounding
        torch.testing.assert_close(out, want, rtol=1e-2 if half else 1e-4, atol=1e-2 if half else 1e-5)


def test_a_kernel_that_reads_the_product_elsewhere_is_no_epilogue() -> None:
    compiled = compile_fn(lambda a, b: (a @ b).t() + 1, torch.randn(16, 24), torch.randn(24, 32))
    assert pairs(compiled.schedule) == []


def test_a_reduction_over_the_product_is_no_epilogue() -> None:
    compiled = compile_fn(lambda a, b: (a @ b).softmax(-1), torch.randn(16, 24), torch.randn(24, 32))
    assert pairs(compiled.schedule) == []


def test_every_template_and_config_compiles_for_hopper() -> None:
    jobs, names = [], []
    for name, (fn, inputs) in sorted(COMPILED.items()):
        half = inputs[0].dtype != torch.float32
        compiled = compile_fn(fn, *inputs, rtol=2e-2 if half else 1e-4, atol=2e-2 if half else 1e-5)
        (m,) = pairs(compiled.schedule)
        every = matmul_configs(m)
        for config in every if name == "f16_addmm_gelu" else every[:1]:  # each tile shape once
            constexprs = {k: v for k, v in config.items() if k not in ("num_warps", "num_stages")}
            jobs.append({"source": matmul_source(m, "mm_epilogue"), "name": "mm_epilogue",
                         "signature": matmul_signature(m), "constexprs": constexprs,
                         "options": {"num_warps": config["num_warps"], "num_stages": config["num_stages"]}})
            names.append(f"{name} {config}")
    failed = [f"{n}:\n{e}" for n, e in zip(names, compile_sources(jobs), strict=True) if e]
    assert not failed, "\n".join(failed)


def test_a_matmuls_inputs_outlive_its_epilogue_in_the_arena() -> None:
    """The epilogue kernel may compute the product from the call's inputs (the template), so its
    outputs may not take their memory: here a's slot would be free for the GELU's output."""
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        a = x * 2  # a buffer of the arena, read last by the matmul
        return F.gelu(a @ w) @ w  # the GELU's output is in the arena too

    schedule = compile_fn(fn, torch.randn(32, 32), torch.randn(32, 32)).schedule
    main = schedule.main
    (i,) = main.epilogues
    call, after = main.steps[i], main.steps[i + 1]
    assert isinstance(call, CallStep)
    assert isinstance(after, KernelStep)
    offsets = dict(main.arena)
    sizes = {b.name: b.nbytes for b in main.buffers}
    inputs = {v.buffer for v in call.node.inputs if v is not None and v.buffer in offsets}
    kernel = schedule.kernel(after.kernel)
    outputs = {p.buffer for p in kernel.params if p.role == "out" and p.buffer in offsets}
    assert inputs
    assert outputs
    for a in inputs:
        for b in outputs:
            assert offsets[a] + sizes[a] <= offsets[b] or offsets[b] + sizes[b] <= offsets[a], (a, b)


@pytest.mark.parametrize("shape", [(1, 9, 32), (2, 1, 32), (3, 2, 5, 32)])
def test_a_linear_layers_epilogue_is_found_over_any_leading_loops(shape: tuple[int, ...]) -> None:
    layer = torch.nn.Linear(32, 48)
    compiled = compile_fn(lambda x: F.gelu(layer(x)), torch.randn(*shape))
    (m,) = pairs(compiled.schedule)
    assert m.epilogue.ranges == (*shape[:-1], 48)


# An operand that is an expanded view (a stride of 0): tune.py's random inputs fill its storage.
PAIRS = {**CASES, "f32_bmm_expanded_relu": (lambda q, w: torch.relu(torch.bmm(q, w.expand(4, 16, 24))),
                                            (torch.randn(4, 8, 16), torch.randn(1, 16, 24)))}


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_tune_py_runs_a_pair_as_the_template_and_as_the_library_alike(name: str, tmp_path: Path) -> None:
    """kernels.json's pair entry, as tune.py's tune_matmul uses it (TRITON_INTERPRET=1 in place
    of a GPU): the library's way (torch's call into a fresh product, then the epilogue kernel's
    default candidate) and the template in its first and last configs give the same outputs."""
    from tasks.targets.cuda import tune
    from tasks.targets.cuda.kernels import write

    fn, inputs = PAIRS[name]
    half = inputs[0].dtype != torch.float32
    compiled = compile_fn(fn, *inputs, rtol=2e-2 if half else 1e-4, atol=2e-2 if half else 1e-5)
    write(compiled.schedule, tmp_path, "auto")
    entries = {e["key"]: e for e in json.loads((tmp_path / "kernels.json").read_text())["kernels"]}
    (entry,) = (e for e in entries.values() if "matmul" in e)
    epilogue = entries[entry["matmul"]["epilogue"]]
    roles = [p["role"] for p in entry["params"]]
    outputs = [i for i, role in enumerate(roles) if role != "in"]
    base = [None if role == "out" else t for t, role in
            zip(tune.random_inputs(entry["params"], "cpu"), roles, strict=True)]
    head, at = tune.call_inputs(entry), entry["matmul"]["product"]
    product, _, arguments = tune.library_arguments(entry, epilogue, base)
    tune.library_call(entry["matmul"], base[0], base[1], base[2] if head == 3 else None, product)
    variant = epilogue["variants"][0]
    config = variant["configs"][0]
    folder = tmp_path / "kernels"
    jobs = [{"source": (folder / epilogue["file"]).read_text(), "name": variant["function"],
             "grid": tune.grid_of(variant, config),
             "args": [*arguments, epilogue["xnumel"], epilogue["rnumel"]],
             "constexprs": {"XBLOCK": config["XBLOCK"], "RBLOCK": config["RBLOCK"]}}]
    library, template = (v for v in entry["variants"])
    assert library["name"] == "library"
    for config in (template["configs"][0], template["configs"][-1]):
        tensors = [tune._fresh(p, "cpu") if role == "out" else t
                   for t, p, role in zip(base, entry["params"], roles, strict=True)]
        jobs.append({"source": (folder / entry["file"]).read_text(), "name": template["function"],
                     "grid": tune.matmul_grid(entry, config), "args": tensors,
                     "constexprs": {k: config[k] for k in ("XBLOCK", "RBLOCK", "KBLOCK", "GROUP_M")}})
    ran = run_sources(jobs)
    # the epilogue's outputs: the pair's parameter i is the epilogue's (i - head), past the product
    want = [ran[0][i - head + (i - head >= at)] for i in outputs]
    assert want
    for got in ran[1:]:
        assert tune.agrees([got[i] for i in outputs], want)
