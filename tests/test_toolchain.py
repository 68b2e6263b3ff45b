"""Tool facts are the tools that run: the key's `cxx` names the compiler the build runs, and the
cuda keys name the ptxas versions triton may assemble with and the arch."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from contract import toolchain
from contract.errors import KilnError
from contract.facts import env_fact, gpu_visible
from tasks.codegen.cpp_build import build_shared, compiler


def _wrapper(folder: Path, marker: Path) -> Path:
    """A C++ compiler that leaves a mark when it runs (g++ underneath)."""
    gxx = shutil.which("g++") or shutil.which("c++")
    assert gxx is not None
    script = folder / "my-cxx"
    script.write_text(f"#!/bin/sh\ntouch {marker}\nexec {gxx} \"$@\"\n")
    script.chmod(0o755)
    return script


def test_the_compiler_the_key_names_is_the_one_that_builds(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "ran"
    monkeypatch.setenv("CXX", str(_wrapper(tmp_path, marker)))
    assert env_fact("cxx", "cpu").startswith(f"{tmp_path / 'my-cxx'}: ")
    assert compiler() == str(tmp_path / "my-cxx")
    source = tmp_path / "k.cpp"
    source.write_text('extern "C" int kiln_answer() { return 42; }\n')
    build_shared(source, tmp_path / "k.so", toolchain.host_isa())
    assert marker.exists()
    assert (tmp_path / "k.so").is_file()


def test_without_cxx_the_fact_and_the_build_take_g_plus_plus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CXX", raising=False)
    gxx = shutil.which("g++")
    assert gxx is not None
    assert compiler() == gxx
    assert env_fact("cxx", "cpu").startswith(f"{gxx}: ")


def test_a_missing_cxx_is_named_in_the_fact_and_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "no-such-compiler-kiln")
    assert env_fact("cxx", "cpu") == "absent"
    with pytest.raises(KilnError, match="no-such-compiler-kiln"):
        compiler()


def test_ptxas_fact_names_an_override_and_the_bundled_ones(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "ptxas"
    fake.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.0, V12.0.76'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("TRITON_PTXAS_PATH", str(fake))
    fact = env_fact("ptxas", "cuda")
    assert "ptxas=12.0.76" in fact
    assert env_fact("ptxas", "cpu") == "-"
    monkeypatch.delenv("TRITON_PTXAS_PATH")
    assert "12.0.76" not in env_fact("ptxas", "cuda")


@pytest.mark.skipif(gpu_visible(), reason="the arch of a visible GPU is its own")
def test_without_a_gpu_cubins_are_for_the_cross_compile_arch() -> None:
    assert env_fact("arch", "cuda") == f"sm_{toolchain.CROSS_ARCH}"
    assert env_fact("arch", "cpu") == "-"
