"""The cuda target's back half without a GPU (what CI checks): gen-cpp writes Triton launches,
link embeds the cubins and links model.so with no CUDA library, and creating the model on a
machine with no driver is a clear error."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pipeline.build import Cache, compile_model
from pipeline.config import load_config
from pipeline.envfacts import gpu_visible
from pipeline.errors import KilnError
from pipeline.runner import BuildOptions

pytest.importorskip("triton")


@pytest.mark.parametrize("name", ["mlp", "cond", "while"])
def test_a_cuda_model_builds_and_links_without_a_gpu(name: str, cache: Cache, tmp_path: Path) -> None:
    result = compile_model(load_config(name), BuildOptions("cuda", tmp_path / name), cache)
    assert {row.stage: row.status for row in result.rows}["link"] == "ran"
    so = tmp_path / name / "model.so"
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
    keys = json.loads(result.entries["autotune"].file("tuning.json").read_text())
    assert keys
    assert all(f"kiln_cubin_{key[:16]}" in local for key in keys)


def test_cuda_model_so_is_the_same_bytes_when_built_again(tmp_path: Path) -> None:
    builds = []
    for run in ("a", "b"):
        cache = Cache.open(tmp_path / f"cache-{run}")
        try:
            compile_model(load_config("mlp"), BuildOptions("cuda", tmp_path / run), cache)
        finally:
            cache.records.close()
        builds.append((tmp_path / run / "model.so").read_bytes())
    assert builds[0] == builds[1]


@pytest.mark.skipif(gpu_visible(), reason="a GPU machine has a driver")
def test_creating_a_cuda_model_without_a_driver_says_so(cache: Cache, tmp_path: Path) -> None:
    from pipeline.api import load

    compile_model(load_config("mlp"), BuildOptions("cuda", tmp_path / "mlp"), cache)
    with pytest.raises(KilnError, match=r"CUDA driver \(libcuda.so.1\) cannot be loaded"):
        load(tmp_path / "mlp")
