"""gen-tuning-code and autotune for the cuda target: the cross-compile without a GPU (what CI
runs), the per-kernel cache, and tune.py on an H200 (gpu marker)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from contract.config import load_config
from contract.facts import gpu_visible
from pipeline.build import Cache, compile_model
from pipeline.runner import BuildOptions

pytest.importorskip("triton")


def _statuses(result: object) -> dict[str, str]:
    return {row.stage: row.status for row in result.rows}  # type: ignore[attr-defined]


@pytest.mark.skipif(gpu_visible(), reason="the no-GPU path; a GPU machine tunes instead")
def test_without_a_gpu_each_kernel_is_cross_compiled_untuned(cache: Cache, tmp_path: Path) -> None:
    result = compile_model(load_config("mlp"), BuildOptions("cuda", tmp_path / "mlp"), cache)
    statuses = _statuses(result)
    assert statuses["gen-tuning-code"] == "ran"
    assert statuses["autotune"] == "ran"
    tuned = result.entries["autotune"]
    decisions = json.loads(tuned.file("tuning.json").read_text())
    spec = json.loads(result.entries["gen-tuning-code"].file("kernels.json").read_text())
    assert spec["target"] == "cuda"
    assert set(decisions) == {k["key"] for k in spec["kernels"]}
    for key, decision in decisions.items():
        assert decision["tuned"] is False
        if decision["variant"] == "library":  # a matmul pair: the call and its kernel, apart
            assert decision["launch"] is None
            assert f"cubins/{key[:16]}.cubin" not in tuned.artifacts
            continue
        cubin = tuned.file(f"cubins/{key[:16]}.cubin").read_bytes()
        assert cubin[:4] == b"\x7fELF"
        facts = json.loads(tuned.file(f"cubins/{key[:16]}.json").read_text())
        assert facts["num_warps"] >= 1
    report = json.loads((tmp_path / "mlp" / "report.json").read_text())
    assert all("(untuned)" in row["variant"] for row in report["kernels"])


@pytest.mark.skipif(gpu_visible(), reason="the no-GPU path")
def test_a_new_layer_compiles_only_its_new_kernels(cache: Cache, tmp_path: Path) -> None:
    config = load_config("mlp")
    first = compile_model(config, BuildOptions("cuda", tmp_path / "a"), cache)
    config.fields["model.kwargs"] = {**config.field("model.kwargs"), "layers": 5, "hidden": 96}
    again = compile_model(config, BuildOptions("cuda", tmp_path / "b"), cache)
    before = set(json.loads(first.entries["autotune"].file("tuning.json").read_text()))
    after = set(json.loads(again.entries["autotune"].file("tuning.json").read_text()))
    notes = next(row.note for row in again.rows if row.stage == "autotune")
    assert f"{len(before & after)} cached" in notes
    assert after - before, "a wider hidden layer makes new kernels"


def test_tune_py_needs_a_gpu_and_says_so(cache: Cache, tmp_path: Path) -> None:
    if gpu_visible():
        pytest.skip("this machine has a GPU")
    result = compile_model(load_config("mlp"), BuildOptions("cuda", tmp_path / "mlp"), cache)
    tune = result.entries["gen-tuning-code"].file("tune.py")
    proc = subprocess.run([sys.executable, str(tune)], capture_output=True, text=True, check=False,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 2
    assert "needs a CUDA GPU" in proc.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["bert", "gpt2", "resnet18"])
def test_tune_py_tunes_every_kernel_on_the_gpu(name: str, cache: Cache, tmp_path: Path) -> None:
    pytest.importorskip("torchvision" if name == "resnet18" else "transformers")
    result = compile_model(load_config(name), BuildOptions("cuda", tmp_path / name), cache)
    records = json.loads(result.entries["autotune"].file("timings.json").read_text())
    assert records
    assert all(r["tuned"] for r in records.values())
    for r in records.values():  # peak memory: one kernel's inputs at a time
        assert r["peak_bytes"] <= 1.2 * r["inputs_bytes"] + (1 << 20), r


@pytest.mark.gpu
def test_a_new_layer_tunes_only_its_new_kernels_on_the_gpu(cache: Cache, tmp_path: Path) -> None:
    config = load_config("mlp")
    first = compile_model(config, BuildOptions("cuda", tmp_path / "a"), cache)
    config.fields["model.kwargs"] = {**config.field("model.kwargs"), "layers": 5, "hidden": 96}
    again = compile_model(config, BuildOptions("cuda", tmp_path / "b"), cache)
    before = set(json.loads(first.entries["autotune"].file("tuning.json").read_text()))
    after = json.loads(again.entries["autotune"].file("timings.json").read_text())
    notes = next(row.note for row in again.rows if row.stage == "autotune")
    cached = len(before & set(after))
    assert 0 < cached < len(after)
    assert f"kernels tuned {len(after)} of {len(after)} ({cached} cached)" in notes


@pytest.mark.gpu
def test_slurm_jobs_tune_the_cuda_target_into_the_items_a_local_run_shares(
        cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The node side of --executor slurm for the cuda target, on a real GPU. The device machine
    has no Slurm, so each share runs here, in process, as its job would on a node
    (tests/test_slurm.py covers the submission on a real cluster)."""
    from contract.facts import gpu_arch, gpu_name
    from tasks.autotune import remote

    def in_process(fn: Any, shares: list[str], settings: Any, scratch: Path) -> str:
        for number, share in enumerate(shares, 1):
            monkeypatch.setenv("SLURM_JOB_ID", str(number))
            fn(share)
        return ""

    monkeypatch.setattr(remote, "run_shares", in_process)
    monkeypatch.setenv("KILN_SLURM_GPU", gpu_name())
    monkeypatch.setenv("KILN_SLURM_ARCH", gpu_arch())
    config = load_config("mlp")
    options = BuildOptions("cuda", tmp_path / "a", in_process=True, executor="slurm")
    jobs = compile_model(config, options, cache)
    records = json.loads(jobs.entries["autotune"].file("timings.json").read_text())
    assert records
    assert all(r["tuned"] and r["where"].startswith("slurm job ") for r in records.values()), records
    assert "slurm jobs" in next(row.note for row in jobs.rows if row.stage == "autotune")
    doomed = cache.store.move_out("autotune", jobs.entries["autotune"].key)  # its items stay
    assert doomed is not None
    shutil.rmtree(doomed)
    local = compile_model(config, BuildOptions("cuda", tmp_path / "b", executor="local"), cache)
    assert f"({len(records)} cached)" in next(row.note for row in local.rows if row.stage == "autotune")
    tuning = [r.entries["autotune"].file("tuning.json").read_bytes() for r in (jobs, local)]
    assert tuning[0] == tuning[1]


@pytest.mark.gpu
def test_the_faster_reduction_variant_wins(cache: Cache, tmp_path: Path) -> None:
    """For each reduction whose persistent and looped variants differ by more than 5% (timed
    again here, directly), the one tuning chose is the faster, unless its default settled it:
    then the variant chosen is near the kernel's bound."""
    from tasks.targets.cuda import tune as cuda_tune

    result = compile_model(load_config("bert"), BuildOptions("cuda", tmp_path / "bert"), cache)
    records = json.loads(result.entries["autotune"].file("timings.json").read_text())
    kernels_json = result.entries["gen-tuning-code"].file("kernels.json")
    spec = json.loads(kernels_json.read_text())
    checked = 0
    for entry in spec["kernels"]:
        if len(entry["variants"]) < 2 or "matmul" in entry:  # a matmul pair: tests/test_cuda_matmul.py
            continue
        module = cuda_tune.load_module(kernels_json.parent / spec["folder"] / entry["file"])
        inputs = cuda_tune.random_inputs(entry["params"], "cuda")
        tensors = [cuda_tune._fresh(p) if p["role"] == "out" else t
                   for p, t in zip(entry["params"], inputs, strict=True)]
        best = {}
        for variant in entry["variants"]:
            fn = getattr(module, variant["function"])
            best[variant["name"]] = min(
                cuda_tune.seconds(cuda_tune.compile_here(entry, fn, c), entry, variant, tensors, c)
                for c in variant["configs"])
        fast, slow = sorted(best, key=lambda name: best[name])
        record = records[entry["key"]]
        if record["settled"]:  # its default was near its bound: a rival can win only the slack
            assert cuda_tune.settles(best[record["variant"]] / 1.1, record["bound"]), (best, record)
        elif best[slow] > 1.05 * best[fast] * 1.05:  # a clear difference, beyond timing noise
            assert record["variant"] == fast, (entry["kernel"], best, record)
            checked += 1
    print(f"checked {checked} reductions with a clear winner")


@pytest.mark.gpu
def test_tune_py_by_hand_tunes_the_kernels_named(cache: Cache, tmp_path: Path) -> None:
    """The generated tune.py run as a person would: `python tune.py --kernels k0 --out ...`."""
    result = compile_model(load_config("mlp"), BuildOptions("cuda", tmp_path / "mlp"), cache)
    folder = result.entries["gen-tuning-code"].path
    spec = json.loads((folder / "kernels.json").read_text())
    first = spec["kernels"][0]
    out = tmp_path / "tuning.json"
    proc = subprocess.run([sys.executable, str(folder / "tune.py"), "--kernels", first["names"][0],
                           "--out", str(out), "--cubins", str(tmp_path / "cubins")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    records = json.loads(out.read_text())
    assert list(records) == [first["key"]]
    assert records[first["key"]]["tuned"]
    assert (tmp_path / "cubins" / f"{first['key'][:16]}.cubin").stat().st_size > 0


def test_precompile_compiles_candidates_into_triton_cache_without_a_gpu(
        cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tune.py's --precompile mode (run beside the tuning workers) needs no GPU and fills
    triton's cache with the very compile tuning then looks up (a cache hit: nothing new)."""
    from tasks.targets.cuda import tune as cuda_tune

    result = compile_model(load_config("mlp"), BuildOptions("cuda", tmp_path / "mlp"), cache)
    folder = result.entries["gen-tuning-code"].path
    spec = json.loads((folder / "kernels.json").read_text())
    entry = spec["kernels"][0]
    labels = [f"{v['name']}:{i}" for v in entry["variants"] for i in range(len(v["configs"]))][:2]
    triton_cache = tmp_path / "triton-cache"
    proc = subprocess.run([sys.executable, str(folder / "tune.py"), "--spec", str(folder / "kernels.json"),
                           "--arch", "90", "--precompile", ",".join(f"{entry['key']}:{x}" for x in labels)],
                          capture_output=True, text=True, check=False,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES="", TRITON_CACHE_DIR=str(triton_cache)))
    assert proc.returncode == 0, proc.stderr
    assert entry["key"][:16] not in proc.stderr  # no candidate failed
    assert len(list(triton_cache.rglob("*.cubin"))) == len(labels)

    monkeypatch.setenv("TRITON_CACHE_DIR", str(triton_cache))
    module = cuda_tune.load_module(folder / spec["folder"] / entry["file"])
    for _, variant, config in cuda_tune.candidates(entry)[:3]:  # the third one was not precompiled
        cuda_tune.explicit_compile(entry, getattr(module, variant["function"]), config, 90)
    assert len(list(triton_cache.rglob("*.cubin"))) == len(labels) + 1


def test_precompile_skips_the_kernels_tuning_has_decided(cache: Cache, tmp_path: Path) -> None:
    result = compile_model(load_config("mlp"), BuildOptions("cuda", tmp_path / "mlp"), cache)
    folder = result.entries["gen-tuning-code"].path
    entry = json.loads((folder / "kernels.json").read_text())["kernels"][0]
    decided = tmp_path / "decided"
    decided.mkdir()
    (decided / entry["key"]).touch()
    triton_cache = tmp_path / "triton-cache"
    proc = subprocess.run([sys.executable, str(folder / "tune.py"), "--spec", str(folder / "kernels.json"),
                           "--arch", "90", "--decided", str(decided), "--precompile", f"{entry['key']}:"
                           f"{entry['variants'][0]['name']}:0"], capture_output=True, text=True, check=False,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES="", TRITON_CACHE_DIR=str(triton_cache)))
    assert proc.returncode == 0, proc.stderr
    assert not list(triton_cache.rglob("*.cubin"))


def test_precompile_takes_every_default_before_any_rival(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks.targets.cuda import tune as cuda_tune

    variant = {"name": "pointwise", "function": "f", "configs": [{"XBLOCK": 1}, {"XBLOCK": 2}]}
    spec = {"folder": ".", "kernels": [{"key": k, "variants": [variant]} for k in ("a", "b", "c")]}
    (tmp_path / "kernels.json").write_text(json.dumps(spec))
    started: list[list[str]] = []
    monkeypatch.setattr("subprocess.Popen", lambda cmd, **_: started.append(cmd))
    monkeypatch.setattr("os.sched_getaffinity", lambda _: set(range(3)))
    cuda_tune.start_precompile(tmp_path / "kernels.json", ["a", "b", "c"], 1, 90, tmp_path)
    assert [cmd[-1] for cmd in started] == ["c:pointwise:0,a:pointwise:0,b:pointwise:1",
                                            "b:pointwise:0,c:pointwise:1,a:pointwise:1"]
    assert started[0][started[0].index("--decided") + 1] == str(tmp_path / "decided")


def test_a_default_settles_only_near_its_bound() -> None:
    from tasks.targets.cuda import tune as cuda_tune

    assert cuda_tune.settles(4.9e-6, 3e-6)  # within 2 us of an empty launch's 3 us
    assert not cuda_tune.settles(5.1e-6, 3e-6)
    assert cuda_tune.settles(114e-6, 100e-6)  # within 15% of a bound set by bandwidth
    assert not cuda_tune.settles(116e-6, 100e-6)


def test_the_launch_signature_follows_the_function_argument_order() -> None:
    """triton's launcher packs arguments in the signature's order and the cubin takes them in
    the function's: explicit_compile must hand triton the signature in the function's order."""
    from types import SimpleNamespace
    from unittest import mock

    from tasks.targets.cuda import tune as cuda_tune

    entry = {"signature": {"RBLOCK": "constexpr", "XBLOCK": "constexpr", "in0": "*fp32", "out0": "*fp32",
                           "rnumel": "i32", "xnumel": "i32"}, "xnumel": 64, "rnumel": 1}
    fn = SimpleNamespace(arg_names=["in0", "out0", "xnumel", "rnumel", "XBLOCK", "RBLOCK"])
    with mock.patch("triton.compiler.ASTSource") as source, mock.patch("triton.compile"):
        config = {"XBLOCK": 64, "RBLOCK": 1, "num_warps": 2, "num_stages": 1}
        cuda_tune.explicit_compile(entry, fn, config, 90)
    assert list(source.call_args.kwargs["signature"]) == fn.arg_names

    class Launcher:  # triton's: one argument per signature entry, constexprs included
        def __getitem__(self, grid: tuple[int, ...]) -> Any:
            def run(*args: Any) -> None:
                assert len(args) == len(entry["signature"])  # type: ignore[arg-type]
                launched.append(args)
            return run

    launched: list[tuple[Any, ...]] = []
    cuda_tune.launch(Launcher(), entry, {"tile": [64, 1]}, ["x", "y"], config)
    assert launched == [("x", "y", 64, 1, 64, 1)]


def test_cubins_assume_aligned_pointers_and_say_which_ints_divide_by_16() -> None:
    from tasks.targets.cuda.tune import compile_attrs

    # kernels.json keeps the signature's keys sorted; positions come from the function
    entry = {"signature": {"RBLOCK": "constexpr", "XBLOCK": "constexpr", "in0": "*fp32", "out0": "*fp16",
                           "rnumel": "i32", "xnumel": "i32"}, "xnumel": 4096, "rnumel": 33}
    args = ["in0", "out0", "xnumel", "rnumel", "XBLOCK", "RBLOCK"]
    divisible = [["tt.divisibility", 16]]
    assert compile_attrs(entry, args) == {(0,): divisible, (1,): divisible, (2,): divisible}
    assert (3,) in compile_attrs(entry | {"rnumel": 768}, args)


def test_arguments_a_compile_folded_are_recorded_for_the_wrapper() -> None:
    """The JIT folds an int equal to 1 (a pointwise kernel's rnumel): the cubin lacks it."""
    from types import SimpleNamespace

    from tasks.targets.cuda.tune import _folded_arguments

    fn = SimpleNamespace(arg_names=["in0", "out0", "xnumel", "rnumel", "XBLOCK", "RBLOCK"])
    kernel = SimpleNamespace(src=SimpleNamespace(fn=fn, constants={(3,): 1, (4,): 1024, (5,): 1}))
    assert _folded_arguments(kernel) == ["rnumel"]
    assert _folded_arguments(object()) == []  # nothing known: nothing folded
