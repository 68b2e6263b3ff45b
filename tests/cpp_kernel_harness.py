"""Build a generated C++ kernel, call it through ctypes, and compare with the schedule interpreter."""

from __future__ import annotations

import ctypes
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from contract.toolchain import host_isa
from tasks.codegen.cpp_build import build_shared
from tasks.codegen.cpp_kernel import CpuVariant, function_name, kernel_source
from tasks.codegen.inputs import index_bounds
from tasks.ir.interpret import empty
from tasks.schedule.model import Kernel
from tasks.schedule.run import run_kernel

needs_cxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on PATH")


def random_params(k: Kernel, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors for the kernel's parameters; an integer read as an index lies in range."""
    gen = torch.Generator().manual_seed(seed)
    bounds = index_bounds(k)
    tensors = {}
    for p in k.params:
        t = empty(replace(p.spec, name=p.buffer))
        if p.spec.dtype.is_float:
            t.copy_(torch.randn(t.shape, generator=gen))
        elif p.spec.dtype.value == "b8":
            t.copy_(torch.randint(0, 2, t.shape, generator=gen).bool())
        else:
            t.copy_(torch.randint(0, bounds.get(p.name, 5), t.shape, generator=gen))
        tensors[p.buffer] = t
    return tensors


def run_cpp(k: Kernel, variant: CpuVariant, tensors: dict[str, torch.Tensor]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src, lib_path = Path(tmp) / f"{k.name}.cpp", Path(tmp) / f"{k.name}.so"
        src.write_text(kernel_source(k, variant))
        build_shared(src, lib_path, host_isa())
        lib = ctypes.CDLL(str(lib_path))
        args = [ctypes.c_void_p(tensors[p.buffer].data_ptr()) for p in k.params]
        getattr(lib, function_name(k))(*args)


def check_kernel(k: Kernel, variant: CpuVariant, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    tensors = random_params(k)
    want = {b: t.clone() for b, t in tensors.items()}
    run_kernel(k, want, empty)
    got = {b: t.clone() for b, t in tensors.items()}
    run_cpp(k, variant, got)
    for p in k.params:
        if p.role != "in":
            _close(got[p.buffer], want[p.buffer], rtol, atol, f"{k.name} {variant.name} {p.name}")


def _close(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float, where: str) -> None:
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{where}: {m}")
