"""kiln end to end on the CPU: compile each reference model, load model.so, match eager."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from contract.config import PROJECT_ROOT, load_config
from contract.errors import KilnError
from kiln.loader import ModelInputError, load
from kiln.run_model import eager_model, flat_tensors, random_inputs
from pipeline.build import Cache, compile_model
from pipeline.integrity import weights_digest
from pipeline.runner import BuildOptions
from tasks.codegen.cpp_build import torch_include, torch_lib
from tasks.weights.files import write_weights
from tests.conftest import kiln

MODELS = ("mlp", "bert-small", "gpt2-small", "convnet", "cond", "while")


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cache]:
    cache = Cache.open(tmp_path_factory.mktemp("e2e") / "cache")
    yield cache
    cache.records.close()


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory, shared_cache: Cache) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("builds")
    return {name: root / name for name in MODELS}


def _build(name: str, builds: dict[str, Path], cache: Cache) -> Path:
    out = builds[name]
    if not (out / "model.so").is_file():
        compile_model(load_config(name), BuildOptions("cpu", out), cache)
    return out


def _assert_matches(got: object, want: object) -> None:
    for a, b in zip(flat_tensors(got), flat_tensors(want), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", [m for m in MODELS if m != "cond"])
def test_model_matches_eager(name: str, builds: dict[str, Path], shared_cache: Cache) -> None:
    out = _build(name, builds, shared_cache)
    config = load_config(name)
    compiled, model = load(out), eager_model(config, out)
    for seed in (1, 2):
        inputs = random_inputs(config, seed)
        _assert_matches(compiled(*inputs), model(*inputs))


def test_cond_takes_both_branches(builds: dict[str, Path], shared_cache: Cache) -> None:
    out = _build("cond", builds, shared_cache)
    config = load_config("cond")
    compiled, model = load(out), eager_model(config, out)
    (x,) = random_inputs(config)
    outcomes = set()
    for scale in (100.0, -100.0):
        inputs = (x * scale,)
        outcomes.add(bool(model.proj(*inputs).sum() > 0))
        _assert_matches(compiled(*inputs), model(*inputs))
    assert outcomes == {True, False}


def test_make_compile_then_load(tmp_path: Path) -> None:
    """What a user types: `kiln compile`, then `kiln run`, then load() in Python."""
    out = tmp_path / "mlp"
    kiln(["compile", "mlp", "--target", "cpu", "--out", str(out), "--quiet"], tmp_path / "cache")
    published = {p.name for p in out.iterdir()}
    assert {"model.so", "kiln_model.h", "weights.safetensors", "model.json"} <= published
    ran = kiln(["run", "mlp", "--out", str(out), "--repeat", "3"], tmp_path / "cache")
    error = float(ran.stdout.split("max abs error vs eager:")[1].split()[0])
    assert error < 1e-4


def test_bad_inputs_get_clear_errors(builds: dict[str, Path], shared_cache: Cache) -> None:
    compiled = load(_build("mlp", builds, shared_cache))
    assert compiled.replay == "off: a cpu model"  # CUDA graphs are a cuda model's (tests/test_cuda_replay.py)
    x = torch.randn(32, 64)
    cases = [
        ((), "takes 1 inputs \\(x\\), got 0"),
        ((x, x), "takes 1 inputs \\(x\\), got 2"),
        ((x.numpy(),), "input 'x' is a ndarray, not a torch.Tensor"),
        ((torch.randn(32, 65),), "input 'x' has shape \\[32, 65\\], the model needs \\[32, 64\\]"),
        ((torch.randn(32, 64, 1),), "input 'x' has shape \\[32, 64, 1\\]"),
        ((x.double(),), "input 'x' is float64, the model needs float32"),
        ((x.long(),), "input 'x' is int64, the model needs float32"),
        ((torch.empty(32, 64, device="meta"),), "input 'x' is not on the CPU"),
    ]
    for args, message in cases:
        with pytest.raises(ModelInputError, match=message):
            compiled(*args)
    # Any strides work: an input laid out otherwise is copied first.
    torch.testing.assert_close(compiled(x.t().contiguous().t()), compiled(x), rtol=0, atol=0)


def _swap_weights(folder: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Write other weights into a build folder as kiln writes them, and record them in its
    model.json, so that only model.so's own checks stand between them and the model."""
    path = folder / "weights.safetensors"
    write_weights(tensors, path)
    meta = json.loads((folder / "model.json").read_text())
    meta["files"]["weights.safetensors"].update(bytes=path.stat().st_size, xxh3_128=weights_digest(path))
    (folder / "model.json").write_text(json.dumps(meta))


def test_weights_that_do_not_match_fail_at_create(builds: dict[str, Path], shared_cache: Cache,
                                                  tmp_path: Path) -> None:
    mlp = _build("mlp", builds, shared_cache)
    broken = tmp_path / "broken"
    shutil.copytree(mlp, broken)
    weights = load_file(str(mlp / "weights.safetensors"))
    weights["head.weight"] = weights["head.weight"].t().contiguous()
    _swap_weights(broken, weights)
    wrong = re.escape("'head.weight' has shape [128, 10], the model needs [10, 128]")
    with pytest.raises(KilnError, match=wrong):
        load(broken)
    del weights["norm.bias"]
    _swap_weights(broken, weights)
    with pytest.raises(KilnError, match=re.escape("entry 'norm.bias' is missing")):
        load(broken)
    # A file kiln did not write (no digest of its own), recorded as if it were: model.so refuses it.
    save_file(load_file(str(mlp / "weights.safetensors")), str(broken / "weights.safetensors"))
    meta = json.loads((broken / "model.json").read_text())
    meta["files"]["weights.safetensors"].update(bytes=(broken / "weights.safetensors").stat().st_size,
                                                xxh3_128=None)
    (broken / "model.json").write_text(json.dumps(meta))
    with pytest.raises(KilnError, match=re.escape('carries no "kiln.xxh3_128" digest')):
        load(broken)
    load(broken, verify=False)  # unchecked, it is still matched by name, dtype and shape
    (broken / "weights.safetensors").write_bytes(b"not a weights file")
    with pytest.raises(KilnError, match=re.escape("has 18 bytes; model.json records")):
        load(broken)
    with pytest.raises(KilnError, match=re.escape("has no model.so")):
        load(tmp_path)


def test_a_new_checkpoint_relinks_nothing(builds: dict[str, Path], shared_cache: Cache,
                                          tmp_path: Path) -> None:
    first = _build("mlp", builds, shared_cache)
    config = load_config("mlp")
    config.fields["weights.seed"] = 7
    result = compile_model(config, BuildOptions("cpu", tmp_path / "reseeded"), shared_cache)
    statuses = {row.stage: row.status for row in result.rows}
    assert statuses["trace"] == "ran"  # weights.seed is trace's too (a model built for real bakes it)
    assert statuses["weights"] == "ran"
    assert all(statuses[s] == "cutoff" for s in ("lower", "schedule", "autotune", "gen-cpp", "link"))
    assert (tmp_path / "reseeded" / "model.so").read_bytes() == (first / "model.so").read_bytes()
    compiled, model = load(tmp_path / "reseeded"), eager_model(config, tmp_path / "reseeded")
    (x,) = random_inputs(config)
    _assert_matches(compiled(x), model(x))
    assert not torch.equal(compiled(x), load(first)(x))


def test_model_json_describes_the_interface(builds: dict[str, Path], shared_cache: Cache) -> None:
    out = _build("bert-small", builds, shared_cache)
    meta = json.loads((out / "model.json").read_text())
    compiled = load(out)
    assert [i["name"] for i in meta["inputs"]] == [i.name for i in compiled.inputs]
    assert [tuple(i["shape"]) for i in meta["outputs"]] == [o.shape for o in compiled.outputs]
    assert compiled.inputs[0].dtype == "int64"


def test_the_cpp_example_in_the_readme_builds_and_runs(builds: dict[str, Path], shared_cache: Cache,
                                                        tmp_path: Path) -> None:
    out = _build("mlp", builds, shared_cache)
    readme = (PROJECT_ROOT / "README.md").read_text()
    block = readme.split("<!-- cpp-example -->\n```cpp\n")[1].split("```\n<!-- /cpp-example -->")[0]
    source = PROJECT_ROOT / "examples" / "cpp" / "run_model.cpp"
    assert block == source.read_text(), "the README's C++ example differs from examples/cpp/run_model.cpp"
    exe = tmp_path / "run_model"
    subprocess.run(["g++", "-std=c++17", "-O1", str(source), f"-I{out}", f"-I{torch_include()}",
                    f"-L{out}", "-l:model.so", f"-L{torch_lib()}", "-ltorch_cpu", "-lc10",
                    f"-Wl,-rpath,{torch_lib()}", f"-Wl,-rpath,{out}", "-o", str(exe)], check=True)
    ran = subprocess.run([str(exe), str(out)], capture_output=True, text=True, check=True)
    x = (torch.arange(32 * 64) % 100).float().reshape(32, 64) * 0.01
    want = load(out)(x)
    name, values = ran.stdout.split(": ", 1)
    assert name == "output0"
    assert float(values.split("sum")[1]) == pytest.approx(float(want.double().sum()), rel=1e-5)
    assert float(values.split()[0]) == pytest.approx(float(want.flatten()[0]), rel=1e-5)
    failed = subprocess.run([str(exe), str(tmp_path)], capture_output=True, text=True, check=False)
    assert failed.returncode == 1
    assert "kiln: weights file" in failed.stderr
    assert "cannot open" in failed.stderr


def test_back_half_artifacts_are_byte_identical_when_rerun(builds: dict[str, Path], shared_cache: Cache,
                                                           tmp_path: Path) -> None:
    _build("cond", builds, shared_cache)
    config = load_config("cond")
    first = compile_model(config, BuildOptions("cpu", tmp_path / "a"), shared_cache)
    stages = frozenset({"gen-tuning-code", "autotune", "gen-cpp", "link"})
    again = compile_model(config, BuildOptions("cpu", tmp_path / "b", force=stages), shared_cache)
    statuses = {row.stage: row.status for row in again.rows if row.stage in stages}
    assert statuses == dict.fromkeys(stages, "ran")
    for stage in sorted(stages):
        before, after = first.entries[stage], again.entries[stage]
        assert sorted(before.artifacts) == sorted(after.artifacts)
        for name in before.artifacts:
            if name != "timings.json":  # measurements; tuning.json holds the decisions
                assert before.file(name).read_bytes() == after.file(name).read_bytes(), f"{stage}/{name}"
