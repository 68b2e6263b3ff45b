"""Typed artifacts between stages and the build folder: the JSON round-trips to the same bytes,
and anything else is refused with what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cache.hashing import pretty_json
from contract.model_json import FileRecord, ModelJson, TensorSpec
from contract.timings import TimingRecord, read_timings, timings_json
from tasks.schedule.model import Schedule
from tasks.targets.cpu import kernels as cpu_kernels
from tasks.targets.cpu.decisions import CpuDecision
from tasks.targets.cpu.decisions import tuning_json as cpu_tuning_json
from tasks.targets.cpu.spec import CpuKernelsJson
from tasks.targets.cuda import kernels as cuda_kernels
from tasks.targets.cuda.decisions import read_tuning
from tasks.targets.cuda.decisions import tuning_json as cuda_tuning_json
from tasks.targets.cuda.spec import CudaKernelsJson
from tests.schedule_harness import compile_fn

_FILES = {"model.so": FileRecord(10, "ab" * 32), "weights.safetensors": FileRecord(4, "cd" * 32, "e" * 32)}
_MODEL = ModelJson("cpu", (TensorSpec("x", (2, 3), (3, 1), "f32"),),
                   (TensorSpec("output0", (2,), (1,), "f32"),), None, '[1, {"type": null}]', _FILES)


@pytest.mark.parametrize("model", [_MODEL, ModelJson("cuda", (), (), None, None)])
def test_model_json_round_trips_to_the_same_bytes(model: ModelJson) -> None:
    text = pretty_json(model.to_json())
    assert ModelJson.from_json(json.loads(text)) == model
    assert pretty_json(ModelJson.from_json(json.loads(text)).to_json()) == text


@pytest.mark.parametrize(("change", "problem"), [
    (lambda d: d.pop("target"), "'target' must be a string"),
    (lambda d: d.update(inputs={}), "'inputs' must be a list"),
    (lambda d: d["outputs"][0].update(shape=[2.5]), "'shape' must be a list of integers"),
    (lambda d: d["files"]["model.so"].update(bytes="10"), "integer bytes"),
    (lambda d: d.update(files=[]), "a files section must be a JSON object"),
])
def test_model_json_refuses_what_kiln_never_writes(change: object, problem: str) -> None:
    data = _MODEL.to_json()
    change(data)  # type: ignore[operator]
    with pytest.raises(ValueError, match=problem):
        ModelJson.from_json(data)


def test_a_build_folder_of_an_older_kiln_says_so(tmp_path: Path) -> None:
    from contract.errors import KilnError
    from pipeline.integrity import read_manifest

    data = _MODEL.to_json()
    for record in data["files"].values():
        record["sha256"] = record.pop("digest")  # how files were listed before xxh3-128
    (tmp_path / "model.json").write_text(json.dumps(data))
    with pytest.raises(KilnError, match="written by an older kiln") as raised:
        read_manifest(tmp_path)
    assert "recompile" in (raised.value.hint or "")


def test_tuning_decisions_round_trip_to_the_same_bytes() -> None:
    cuda = {"k1": {"variant": "persistent", "function": "k1_persistent", "tuned": True, "cubin": "ab" * 32,
                   "config": {"XBLOCK": 32, "RBLOCK": 16, "num_warps": 4, "num_stages": 1},
                   "launch": {"name": "k1_persistent", "num_warps": 4, "shared": 0, "folded": ["rnumel"],
                              "global_scratch_size": 0, "profile_scratch_size": 0}}}
    assert cuda_tuning_json(read_tuning(cuda)) == cuda
    cpu = {"k1": {"variant": "par1_simd", "config": {"parallel": 1, "simd": True, "split_r": False},
                  "object": "cd" * 32}}
    assert cpu_tuning_json({k: CpuDecision.from_json(d) for k, d in cpu.items()}) == cpu


def _softmax_then_sum_schedule() -> Schedule:
    def model(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, -1).sum(0) + torch.arange(33.0)

    return compile_fn(model, torch.randn(8, 33)).schedule


def test_kernels_json_round_trips_to_the_same_bytes_on_both_targets(tmp_path: Path) -> None:
    schedule = _softmax_then_sum_schedule()
    written = {"cpu": cpu_kernels.write(schedule, tmp_path / "cpu", "x86-64"),
               "cuda": cuda_kernels.write(schedule, tmp_path / "cuda")}
    for target, reader in (("cpu", CpuKernelsJson.from_json), ("cuda", CudaKernelsJson.from_json)):
        text = (tmp_path / target / "kernels.json").read_text()
        spec = reader(json.loads(text))
        assert spec == written[target]
        assert pretty_json(spec.to_json()) == text
        assert len(spec.kernels) >= 2
        assert all(k.params and k.variants for k in spec.kernels)


def test_a_tuner_record_becomes_a_timings_record_that_round_trips() -> None:
    cuda = {"key": "k1", "label": "looped:1", "variant": "looped", "function": "k1_looped",
            "config": {"XBLOCK": 1, "RBLOCK": 64, "num_warps": 4, "num_stages": 1}, "default": "persistent:0",
            "timings": {"persistent:0": 2e-5, "looped:1": 1e-5, "looped:2": None},
            "errors": {"looped:2": "out of resources"}, "gain": 2.0, "tuned": True,
            "inputs_bytes": 4096, "peak_bytes": 8192, "gpu": "NVIDIA H200"}
    record = TimingRecord.from_json(cuda)
    assert (record.seconds, record.peak_bytes, record.extra["gpu"]) == (1e-5, 8192, "NVIDIA H200")
    assert TimingRecord.from_json(record.to_json()) == record
    cpu = {"key": "k2", "variant": "par1_simd", "config": {"parallel": 1, "simd": True, "split_r": False},
           "default": "par1_simd", "timings": {"par1_simd": 3e-6, "par1": None}, "errors": {"par1": "differ"},
           "gain": 1.0, "tuned": True}
    record = TimingRecord.from_json(cpu)
    assert (record.label, record.seconds, record.extra) == ("par1_simd", 3e-6, {})
    text = pretty_json(timings_json({"k2": record}))
    assert pretty_json(timings_json(read_timings(json.loads(text)))) == text
