"""The cuda target's back half without a GPU (what CI checks): gen-cpp writes Triton launches,
link embeds the cubins and links model.so with no CUDA library, and creating the model on a
machine with no driver is a clear error."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.config import load_config
from contract.errors import KilnError
from contract.facts import gpu_visible
from pipeline.build import Cache, compile_model
from pipeline.report import report_json
from pipeline.runner import BuildOptions

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def mlp_build(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """One cuda build of mlp, shared by the tests here (each compile cross-compiles its kernels)."""
    root = tmp_path_factory.mktemp("cuda-build")
    cache = Cache.open(root / "cache")
    try:
        yield compile_model(load_config("mlp"), BuildOptions("cuda", root / "mlp"), cache), root / "mlp"
    finally:
        cache.records.close()


@pytest.mark.parametrize("name", ["mlp", "while"])
def test_a_cuda_model_builds_and_links_without_a_gpu(name: str, mlp_build: tuple[Any, Path], cache: Cache,
                                                      tmp_path: Path) -> None:
    if name == "mlp":
        result, _ = mlp_build
    else:
        result = compile_model(load_config(name), BuildOptions("cuda", tmp_path / name), cache)
    assert {row.stage: row.status for row in result.rows}["link"] == "ran"
    so = result.out / "model.so"
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True,
                             check=True).stdout
    assert "kiln_model_run_on_stream" in symbols
    needed = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True, check=True).stdout
    assert "libcuda" not in needed
    assert "torch_cuda" not in needed
    wrapper = result.entries["gen-cpp"].file("wrapper.cpp").read_text()
    assert "kiln::launch(ctx" in wrapper
    table = wrapper.split("kKernels[] = {")[1].split("};")[0]
    assert table.count("kiln_cubin_") == table.count("\n") - 1  # one row per distinct kernel launched
    local = subprocess.run(["nm", str(so)], capture_output=True, text=True, check=True).stdout
    decisions = json.loads(result.entries["autotune"].file("tuning.json").read_text())
    launched = [key for key, d in decisions.items() if d["launch"] is not None]  # not a library pair
    assert launched
    assert all(f"kiln_cubin_{key[:16]}" in local for key in launched)


def test_matmul_templates_build_and_link_without_a_gpu(tmp_path: Path, cache: Cache) -> None:
    """tuning.matmul = "template": mlp's three linear layers into a GELU run as templates, each
    launched in place of its library call and the GELU's kernel (untuned: no GPU)."""
    config = load_config("mlp")
    config = dataclasses.replace(config, fields={**config.fields, "tuning.matmul": "template"})
    result = compile_model(config, BuildOptions("cuda", tmp_path / "mlp"), cache)
    wrapper = result.entries["gen-cpp"].file("wrapper.cpp").read_text()
    assert wrapper.count("_pw_gelu: mm and gelu") == 3  # one template per layer...
    assert wrapper.count("kiln::mm(") == 2  # ... and the two matmuls into other kernels
    table = wrapper.split("kKernels[] = {")[1].split("};")[0]
    names = [line.split('"')[1] for line in table.strip().splitlines()]
    assert [n for n in names if "gelu" in n] == ["mm_k0_pw_gelu", "mm_k1_pw_gelu"]  # no GELU alone
    rows = {row["kernel"]: row for row in report_json(result)["kernels"]}
    assert rows["mm_k1"]["launches"] == 2
    assert not any(name.startswith(("k0", "k1")) for name in rows)  # the GELUs: fused
    assert rows["mm_k1"]["variant"].startswith("matmul X")
    kernels = json.loads(result.entries["gen-tuning-code"].file("kernels.json").read_text())["kernels"]
    pairs = [e for e in kernels if "matmul" in e]
    assert [len(e["variants"]) for e in pairs] == [1, 1]  # the template only: no library candidate
    assert (result.out / "model.so").is_file()


def test_untuned_matmul_pairs_keep_the_library_calls(tmp_path: Path, cache: Cache) -> None:
    """tuning.matmul = "auto" without a GPU: each pair's default, the library's call and the
    GELU's kernel, ships; the pairs have no cubin, and model.so links without them."""
    config = load_config("mlp")
    config = dataclasses.replace(config, fields={**config.fields, "tuning.matmul": "auto"})
    result = compile_model(config, BuildOptions("cuda", tmp_path / "mlp"), cache)
    wrapper = result.entries["gen-cpp"].file("wrapper.cpp").read_text()
    assert wrapper.count("kiln::mm(") == 5
    assert "_matmul" not in wrapper
    decisions = json.loads(result.entries["autotune"].file("tuning.json").read_text())
    library = [d for d in decisions.values() if d["variant"] == "library"]
    assert len(library) == 2
    assert all(d["launch"] is None and not d["cubin"] and not d["tuned"] for d in library)
    rows = {row["kernel"]: row for row in report_json(result)["kernels"]}
    assert rows["mm_k1"]["variant"] == "library (untuned)"
    assert rows["mm_k1"]["share"] is None  # its time would be the call's and the GELU's, counted apart
    assert (result.out / "model.so").is_file()


def test_cuda_model_so_is_the_same_bytes_when_built_again(mlp_build: tuple[Any, Path],
                                                          tmp_path: Path) -> None:
    cache = Cache.open(tmp_path / "cache")  # a cache of its own: everything built again
    try:
        compile_model(load_config("mlp"), BuildOptions("cuda", tmp_path / "again"), cache)
    finally:
        cache.records.close()
    assert (tmp_path / "again" / "model.so").read_bytes() == (mlp_build[1] / "model.so").read_bytes()


@pytest.mark.skipif(gpu_visible(), reason="a GPU machine has a driver")
def test_creating_a_cuda_model_without_a_driver_says_so(mlp_build: tuple[Any, Path]) -> None:
    from kiln import load

    with pytest.raises(KilnError, match=r"CUDA driver \(libcuda.so.1\) cannot be loaded"):
        load(mlp_build[1])
