"""`kiln bench`: its parts (config edits, the layer knob, measured child processes, the chart's
fallback, the CLI's options) and a CPU smoke run on mlp and bert-small whose structure, not its
numbers, is checked."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from bench.chart import write_chart
from bench.edits import dump_toml, layer_knob, write_config
from bench.procs import ROOT, UNFINISHED, child_env, crash_site, run_measured, run_worker
from bench.render import notes
from bench.suite import (
    CUDA_ONLY,
    ENGINES,
    NOT_REACHED,
    STEPS,
    BenchOptions,
    Run,
    bench_inductor,
    engines_for,
    run_bench,
)
from cli.main import main
from contract.config import PROJECT_ROOT, load_config
from kiln import KilnError
from tests.conftest import kiln

CONFIGS = sorted((PROJECT_ROOT / "configs").glob("*.toml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_dump_toml_round_trips_every_config(path: Path) -> None:
    raw = tomllib.loads(path.read_text())
    assert tomllib.loads(dump_toml(raw)) == raw


def test_write_config_edits_kwargs_and_checkpoint(tmp_path: Path) -> None:
    config = load_config("mlp")
    kwargs = {**config.field("model.kwargs"), "layers": 5}
    checkpoint = tmp_path / "w.safetensors"
    written = write_config(config, tmp_path, "mlp-edit", kwargs=kwargs, checkpoint=checkpoint)
    edited = load_config(str(written))
    assert edited.field("model.kwargs")["layers"] == 5
    assert edited.checkpoint == checkpoint.resolve()
    assert edited.field("inputs") == config.field("inputs")
    assert edited.field("model.factory") == config.field("model.factory")
    plus_one = load_config(str(write_config(edited, tmp_path / "again", "mlp-plus", seeded=True)))
    assert plus_one.checkpoint is None
    assert plus_one.field("model.kwargs")["layers"] == 5


def test_layer_knob_from_kwargs_defaults_and_module(tmp_path: Path) -> None:
    assert layer_knob(load_config("mlp")) == {"knob": "layers", "value": 4}
    assert layer_knob(load_config("bert-small")) == {"knob": "num_hidden_layers", "value": 2}
    assert "no layer-count kwarg" in layer_knob(load_config("convnet"))["skipped"]
    # kwargs without the knob: mlp's factory default, and the config of the BERT a **kwargs
    # factory builds (transformers' default of 12 layers)
    mlp = load_config("mlp")
    kwargs = {k: v for k, v in mlp.field("model.kwargs").items() if k != "layers"}
    assert layer_knob(load_config(str(write_config(mlp, tmp_path, "mlp-default", kwargs=kwargs)))) == {
        "knob": "layers", "value": 4}
    tiny = {"hidden_size": 16, "num_attention_heads": 2, "intermediate_size": 32, "vocab_size": 64}
    bert = write_config(load_config("bert-small"), tmp_path, "bert-default", kwargs=tiny)
    assert layer_knob(load_config(str(bert))) == {"knob": "num_hidden_layers", "value": 12}


def test_run_measured_reports_peak_rss_failure_and_timeout(tmp_path: Path) -> None:
    env = child_env(tmp_path / "c")
    grow = "b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096])"
    done = run_measured([sys.executable, "-c", grow], env, timeout=60)
    assert done.failure("grow") is None
    assert done.peak_rss_bytes > 200 * 2**20
    failed = run_measured([sys.executable, "-c", "raise SystemExit('boom')"], env, timeout=60)
    assert failed.returncode == 1
    assert "boom" in (failed.failure("child") or "")
    slow = run_measured([sys.executable, "-c", "import time; time.sleep(30)"], env, timeout=1)
    assert slow.timed_out
    assert "timed out" in (slow.failure("sleeper") or "")


def test_a_failing_worker_is_an_error_string(tmp_path: Path) -> None:
    spec = {"task": "no-such-task", "result": str(tmp_path / "r.json")}
    found = run_worker(spec, child_env(tmp_path / "c"), timeout=60)
    assert found["error"] == "KeyError: 'no-such-task'"


def test_a_worker_that_crashes_in_a_later_step_keeps_the_figures_before_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = tmp_path / "r.json"
    compiled = {"ready_at": 1.0, "phases": {"compile_s": 2.0}, UNFINISHED: "latency"}
    crash = (f"import os, pathlib, signal; pathlib.Path({str(result)!r}).write_text("
             f"{json.dumps(compiled)!r}); os.kill(os.getpid(), signal.SIGSEGV)")
    monkeypatch.setattr("bench.procs.run_measured",
                        lambda cmd, env, timeout: run_measured([sys.executable, "-c", crash], env, timeout))
    found = run_worker({"task": "compile", "result": str(result)}, child_env(tmp_path / "c"), timeout=60)
    assert found["phases"] == {"compile_s": 2.0}
    assert "ready_s" in found
    assert UNFINISHED not in found
    want = "compile worker died with SIGSEGV: Segmentation fault in <string>:1 <module>"
    assert found["latency"]["error"] == want


def test_a_crash_names_its_innermost_frame_and_the_bench_code_that_called_it() -> None:
    packages = "/opt/venv/lib/python3.12/site-packages"
    dump = f"""UserWarning: TensorFloat32 tensor cores
Fatal Python error: Segmentation fault

Thread 0x00007f2a7dfeb6c0 (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 359 in wait

Current thread 0x00007f2da9aa8140 (most recent call first):
  File "{packages}/torch/export/pt2_archive/_package.py", line 1045 in _load_aoti
  File "{packages}/torch/_inductor/__init__.py", line 267 in aoti_load_package
  File "{ROOT}/bench/workers.py", line 111 in loaded
  File "<frozen runpy>", line 198 in _run_module_as_main

Extension modules: numpy._core._multiarray_umath, torch._C (total: 2)
"""
    assert crash_site(dump) == ("Segmentation fault in torch/export/pt2_archive/_package.py:1045 _load_aoti, "
                                "called from bench/workers.py:111 loaded")
    assert crash_site("Traceback (most recent call last):\nValueError: no") is None


def test_chart_without_matplotlib_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    line = write_chart({"engines": {}}, tmp_path / "bench.png")
    assert line.startswith("no chart: matplotlib is not installed")
    assert not (tmp_path / "bench.png").exists()


@pytest.mark.parametrize("flag", [["--engines", "kiln,tvm"], ["--recompiles", "cold"], ["--engines", ""]])
def test_bench_rejects_unknown_choices(flag: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "mlp", *flag])
    assert exit_.value.code == 2
    assert "pick from" in capsys.readouterr().err


def test_the_cuda_graph_modes_of_torch_compile_are_cudas_only() -> None:
    from bench.workers import compile_mode

    assert engines_for("cuda", ENGINES, explicit=False) == ENGINES
    assert engines_for("cpu", ENGINES, explicit=False) == ("kiln", "eager", "torch.compile", "aoti")
    with pytest.raises(KilnError, match=r"reduce-overhead: CUDA graphs, so the cuda target only"):
        engines_for("cpu", ("kiln", "torch.compile:reduce-overhead"), explicit=True)
    assert [compile_mode(e) for e in ENGINES if e.startswith("torch.compile")] == \
        [None, "reduce-overhead", "max-autotune"]


# ---- the smoke runs ----


def is_figure(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def assert_every_step_reported(bench: dict[str, Any]) -> None:
    """Every engine and step present, each with a number, an error string or a skip reason."""
    assert list(bench["engines"]) == [e for e in ENGINES if bench["target"] == "cuda" or e not in CUDA_ONLY]
    for engine, steps in bench["engines"].items():
        assert list(steps) == list(STEPS), engine
        for step, found in steps.items():
            key = "median_ms" if step == "latency" else "seconds"
            said = found.get("error") or found.get("skipped")
            assert is_figure(found.get(key)) or (isinstance(said, str) and said), (engine, step, found)


def bench(model: str, out: Path, cache: Path, *flags: str) -> tuple[str, dict[str, Any]]:
    args = ["bench", model, "--target", "cpu", "--runs", "5", "--warmup", "1", "--out", str(out), *flags]
    proc = kiln(args, cache)
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return proc.stdout, json.loads((out / "bench.json").read_text())


# Note: what the smoke runs is chosen by its cost on CI's 2 cores, measured here (`time pytest
# tests/test_bench.py`: 98 s for the file, of which mlp 58 s and bert-small 31 s). Alone, mlp's
# kiln steps take ~35 s (cold 15-17, both edits 15, latency), torch.compile's cold compile 20-27 s
# (its warm one ~7 s more), AOTInductor's cold compile 29-39 s (warm ~15 s more) and bert-small's
# kiln cold compile ~23 s: all of it on both models takes ~2.5 min, past the smoke's budget (well
# under 2 minutes; the whole suite must stay under 20). So mlp runs kiln with both edits, eager
# and torch.compile, and bert-small kiln and eager; the warm recompiles (the cold compile's code
# run again) and AOTInductor (the compile job's other branch, run by `make bench MODEL=mlp`: the
# README's table) are left out. A failing engine is an error string either way
# (test_a_failing_worker_is_an_error_string).
@pytest.mark.slow
def test_bench_mlp_smoke(tmp_path: Path) -> None:
    stdout, found = bench("mlp", tmp_path / "out", tmp_path / "cache", "--engines",
                          "kiln,eager,torch.compile", "--recompiles", "weight-swap,layer-edit")
    assert_every_step_reported(found)
    kiln_steps = found["engines"]["kiln"]
    assert is_figure(kiln_steps["cold"]["seconds"])
    assert is_figure(kiln_steps["latency"]["median_ms"])
    assert kiln_steps["latency"]["max_abs_error"] < 1e-4
    assert kiln_steps["layer_edit"]["edit"] == "layers 4 -> 5"
    assert kiln_steps["layer_edit"]["stages"]["autotune"]["status"] == "ran"
    swap = kiln_steps["weight_swap"]["stages"]
    assert swap["trace"]["status"] == "hit"  # a new checkpoint: the weights stage alone runs
    assert swap["weights"]["status"] == "ran"
    assert swap["link"]["status"] == "hit"
    assert kiln_steps["warm"] == {"skipped": "left out by --recompiles"}
    assert found["engines"]["aoti"]["cold"] == {"skipped": "left out by --engines"}
    assert is_figure(found["engines"]["eager"]["latency"]["median_ms"])
    for title in ("kiln bench mlp (target cpu", "where kiln's compile time went",
                  "kiln compile mlp (target cpu)", "kernels (", "kiln's compiles in this run", "wrote "):
        assert title in stdout


@pytest.mark.slow
def test_bench_bert_small_smoke(tmp_path: Path) -> None:
    stdout, found = bench("bert-small", tmp_path / "out", tmp_path / "cache", "--engines", "kiln,eager",
                          "--recompiles", "none")
    assert_every_step_reported(found)
    assert is_figure(found["engines"]["kiln"]["latency"]["median_ms"])
    assert found["engines"]["torch.compile"]["latency"] == {"skipped": "left out by --engines"}
    assert (tmp_path / "out" / "kiln" / "report.json").is_file()
    assert "kiln compile bert-small (target cpu)" in stdout


def test_each_engine_done_is_handed_over_before_the_next_runs(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`kiln bench` writes bench.json after every engine, so a run cut short keeps what it had."""
    def fake(engine: str) -> Any:
        return lambda run: {step: {"seconds": 1.0, "by": engine} for step in STEPS}

    monkeypatch.setattr("bench.suite.BENCHES", {engine: fake(engine) for engine in ENGINES})
    snapshots: list[dict[str, Any]] = []
    opts = BenchOptions("mlp", "cpu", tmp_path, engines=("kiln", "aoti"))
    done = run_bench(opts, log=lambda line: None, partial=snapshots.append)
    assert len(snapshots) == len(ENGINES) - len(CUDA_ONLY)  # a cpu run lists no cuda-only engine
    first = snapshots[0]["engines"]
    assert first["kiln"]["cold"] == {"seconds": 1.0, "by": "kiln"}
    assert first["aoti"]["cold"] == NOT_REACHED
    assert "AOTInductor: not reached: the bench stopped before this engine" in notes(snapshots[0])
    assert snapshots[1]["engines"]["eager"]["cold"] == {"skipped": "left out by --engines"}
    assert snapshots[-1] == done


class RecordingRun(Run):
    """A Run whose workers are not started: each spec is recorded and answered from `answers`."""

    specs: list[dict[str, Any]]
    answers: dict[str, dict[str, Any]]

    def __init__(self, tmp: Path, answers: dict[str, dict[str, Any]]) -> None:
        super().__init__(BenchOptions("mlp", "cpu", tmp, recompiles=("warm",)), load_config("mlp"), tmp,
                         None, lambda line: None)
        object.__setattr__(self, "specs", [])
        object.__setattr__(self, "answers", answers)

    def worker(self, spec: dict[str, Any], caches: str) -> dict[str, Any]:
        self.specs.append(spec)
        return dict(self.answers[Path(spec["result"]).stem])


COMPILED: dict[str, Any] = {"ready_s": 1.0, "peak_rss_bytes_ready": 1, "peak_gpu_bytes": None, "phases": {},
                            "process_s": 2.0}


def test_aoti_latency_loads_the_cold_package_in_a_fresh_process(tmp_path: Path) -> None:
    run = RecordingRun(tmp_path, {"aoti-cold": COMPILED, "aoti-warm": COMPILED,
                                  "aoti-latency": {"median_ms": 0.5}})
    found = bench_inductor(run, "aoti")
    cold, warm, latency = run.specs
    assert not cold["latency"]
    assert not warm["latency"]
    assert (latency["task"], latency["package"]) == ("latency", cold["package"])
    assert found["latency"] == {"median_ms": 0.5}


def test_torch_compile_latency_is_measured_in_the_compiling_process(tmp_path: Path) -> None:
    run = RecordingRun(tmp_path, {"torch-compile-cold": {**COMPILED, "latency": {"median_ms": 0.7}},
                                  "torch-compile-warm": COMPILED})
    found = bench_inductor(run, "torch.compile")
    assert [spec["latency"] for spec in run.specs] == [True, False]
    assert found["latency"] == {"median_ms": 0.7}


def test_a_failed_aoti_compile_skips_its_latency(tmp_path: Path) -> None:
    run = RecordingRun(tmp_path, {"aoti-cold": {"error": "boom"}, "aoti-warm": COMPILED})
    found = bench_inductor(run, "aoti")
    assert len(run.specs) == 2
    assert found["latency"] == {"skipped": "aoti's cold compile failed"}
